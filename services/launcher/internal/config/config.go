// Package config reads the launcher's configuration: flags, then env vars, then defaults.
package config

import (
	"errors"
	"path/filepath"
	"time"

	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/obs"
)

// Config is the launcher's whole configuration.
type Config struct {
	Log    obs.LogConfig
	Listen struct {
		HTTP string // /healthz, /readyz, /metrics
	}
	Pod struct {
		ID      string
		RootDir string // the pod's filesystem root; relative paths below are under it
	}
	Envoy struct {
		Binary        string // empty or missing: write the bootstrap and wait, do not start Envoy
		BootstrapPath string
		AdminAddr     string
		DrainTime     time.Duration
	}
	SDSSocket string
	XDSSocket string
	// WaitFor bounds how long to wait for the SDS and xDS sockets before giving up.
	WaitFor time.Duration
}

// Default returns the defaults, as Istio lays out a pod.
func Default() Config {
	var c Config
	c.Log = obs.LogConfig{Level: "info"}
	c.Listen.HTTP = "127.0.0.1:15021"
	c.Pod.RootDir = "."
	c.Envoy.BootstrapPath = "etc/istio/proxy/envoy-rev.json"
	c.Envoy.AdminAddr = "127.0.0.1:15000"
	c.Envoy.DrainTime = 45 * time.Second
	c.SDSSocket = "var/run/secrets/workload-spiffe-uds/socket"
	c.XDSSocket = "etc/istio/proxy/XDS"
	c.WaitFor = 2 * time.Minute
	return c
}

// Load reads flags and env vars over the defaults and validates the result.
func Load(args []string, getenv func(string) string) (Config, error) {
	c := Default()
	fs := flagenv.New("launcher", getenv)
	c.Log.Bind(fs)
	fs.String(&c.Listen.HTTP, "http-addr", "HTTP_ADDR", c.Listen.HTTP, "health and metrics listen address")
	fs.String(&c.Pod.ID, "pod", "POD_NAME", c.Pod.ID, "pod id")
	fs.String(&c.Pod.RootDir, "pod-root", "POD_ROOT", c.Pod.RootDir, "pod root directory")
	fs.String(&c.Envoy.Binary, "envoy-binary", "ENVOY_BINARY", c.Envoy.Binary, "path to envoy; empty: only write the bootstrap")
	fs.String(&c.Envoy.BootstrapPath, "bootstrap", "ENVOY_BOOTSTRAP", c.Envoy.BootstrapPath, "where to write Envoy's bootstrap")
	fs.String(&c.Envoy.AdminAddr, "envoy-admin", "ENVOY_ADMIN_ADDR", c.Envoy.AdminAddr, "Envoy admin address")
	fs.Duration(&c.Envoy.DrainTime, "drain-time", "TERMINATION_DRAIN_DURATION", c.Envoy.DrainTime, "how long Envoy drains on shutdown")
	fs.String(&c.SDSSocket, "sds-socket", "SDS_SOCKET", c.SDSSocket, "sds-edge's socket")
	fs.String(&c.XDSSocket, "xds-socket", "XDS_SOCKET", c.XDSSocket, "xds-relay's socket")
	fs.Duration(&c.WaitFor, "wait-for", "LAUNCHER_WAIT", c.WaitFor, "how long to wait for the sockets")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.SDSSocket = c.under(c.SDSSocket)
	c.XDSSocket = c.under(c.XDSSocket)
	c.Envoy.BootstrapPath = c.under(c.Envoy.BootstrapPath)
	return c, c.Validate()
}

func (c Config) under(p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(c.Pod.RootDir, p)
}

// Validate reports every problem at once, naming the flag.
func (c Config) Validate() error {
	var errs []error
	if err := c.Log.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Pod.ID == "" {
		errs = append(errs, errors.New("-pod: required"))
	}
	if c.Listen.HTTP == "" {
		errs = append(errs, errors.New("-http-addr: required"))
	}
	if c.Envoy.DrainTime < 0 {
		errs = append(errs, errors.New("-drain-time: must not be negative"))
	}
	if c.WaitFor <= 0 {
		errs = append(errs, errors.New("-wait-for: must be positive"))
	}
	return errors.Join(errs...)
}
