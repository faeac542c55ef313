// Package config reads the node agent's configuration: flags, then env vars, then
// defaults.
package config

import (
	"net/url"
	"time"

	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
)

// Config is the node agent's whole configuration.
type Config struct {
	Log  obs.LogConfig
	Node string // NODE_NAME: the Kubernetes node this agent serves
	Hub  struct {
		URL       string        // the hub's leaf node URL (nats:// or tls://)
		CAFile    string        // the hub's CA, for tls://
		TokenFile string        // the node agent's own service-account token: the hub admits the node by it
		Reread    time.Duration // how often the token file is read again
	}
	Listen struct {
		NATS string // where the node's pods connect
		HTTP string // /healthz, /readyz, /metrics
	}
	Pods        policy.PodLimits
	TrustDomain string       // TRUST_DOMAIN: the identities the pods' tokens name
	Auth        authn.Config // how the pods' tokens are verified, as the signer does
}

// Default returns the defaults.
func Default() Config {
	var c Config
	c.Log = obs.LogConfig{Level: "info"}
	c.Hub.TokenFile = "/var/run/secrets/tokens/meshagent-node"
	c.Hub.Reread = 30 * time.Second
	c.Listen.NATS = "127.0.0.1:4223"
	c.Listen.HTTP = "127.0.0.1:15095"
	c.Pods = policy.DefaultPodLimits()
	c.TrustDomain = "cluster.local"
	c.Auth = authn.DefaultConfig()
	return c
}

// Load reads flags and env vars over the defaults and validates the result.
func Load(args []string, getenv func(string) string) (Config, error) {
	c := Default()
	fs := flagenv.New("node-agent", getenv)
	c.Log.Bind(fs)
	fs.String(&c.Node, "node", "NODE_NAME", "", "the Kubernetes node this agent serves (the downward API's spec.nodeName): only pods whose token names it are admitted")
	fs.String(&c.Hub.URL, "hub", "MESHAGENT_HUB_URL", "", "the hub's leaf node URL (nats://host:7422, tls:// in a fleet)")
	fs.String(&c.Hub.CAFile, "hub-ca", "MESHAGENT_HUB_CA", "", "CA file that verifies the hub's leaf listener (tls://)")
	fs.String(&c.Hub.TokenFile, "token-file", "NODE_TOKEN_FILE", c.Hub.TokenFile, "the node agent's own service-account token, bound to its pod and node: the hub admits this node by it")
	fs.Duration(&c.Hub.Reread, "token-reread", "NODE_TOKEN_REREAD", c.Hub.Reread, "how often the token file is read again; a new token reconnects the node to the hub with it")
	fs.String(&c.Listen.NATS, "listen", "NODE_BUS_ADDR", c.Listen.NATS, "where this node's pods connect (their NATS_URL)")
	fs.String(&c.Listen.HTTP, "http-addr", "HTTP_ADDR", c.Listen.HTTP, "health and metrics listen address")
	fs.Duration(&c.Pods.Lifetime, "pod-user-lifetime", "BUS_POD_USER_LIFETIME", c.Pods.Lifetime, "longest life of a pod's bus user, whatever its token's (less up to 10% at random)")
	fs.String(&c.TrustDomain, "trust-domain", "TRUST_DOMAIN", c.TrustDomain, "SPIFFE trust domain")
	c.Auth.Bind(fs, getenv)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.Auth.Defaults()
	return c, c.Validate()
}

// Validate reports every problem at once, naming the flag.
func (c Config) Validate() error {
	var p flagenv.Problems
	p.Add(c.Log.Validate())
	p.Check(c.Node != "", "-node: required (NODE_NAME, from the downward API's spec.nodeName)")
	if c.Node != "" {
		p.Add(events.ValidateNodeName(c.Node))
	}
	u, err := url.Parse(c.Hub.URL)
	p.Check(c.Hub.URL != "" && err == nil && (u.Scheme == "nats" || u.Scheme == "tls") && u.Host != "" && u.User == nil,
		"-hub: want nats://host:port or tls://host:port, with no credentials in it (the token comes from -token-file)")
	p.Check(c.Hub.CAFile == "" || (err == nil && u.Scheme == "tls"), "-hub-ca: only with a tls:// hub")
	p.Check(c.Hub.TokenFile != "", "-token-file: required")
	p.Check(c.Hub.Reread >= time.Second, "-token-reread: must be at least 1s")
	p.Check(c.Listen.NATS != "", "-listen: required")
	p.Check(c.Listen.HTTP != "", "-http-addr: required")
	p.Add(c.Pods.Validate())
	c.Auth.Validate(&p)
	p.Check(c.Auth.Sources() == 1, "-jwks-file, -jwks-url, -token-issuer-discovery or -token-review: required (the node agent verifies its pods' tokens)")
	p.Check(c.TrustDomain != "", "-trust-domain: required")
	return p.Err()
}

// Process is what the lifecycle reads: the logger and the health address; the
// node agent is a server of the bus, not a client.
func (c Config) Process() lifecycle.Process {
	return lifecycle.Process{Name: "node-agent", Log: c.Log, LogWith: []any{"node", c.Node}, HTTP: c.Listen.HTTP}
}
