// Package launch waits for the pod's SDS and xDS sockets, writes Envoy's bootstrap,
// starts Envoy (when a binary is configured) and drains it on shutdown.
package launch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/services/launcher/internal/bootstrap"
	"github.com/meshagent/meshagent/services/launcher/internal/config"
)

// Launcher runs one pod's Envoy.
type Launcher struct {
	cfg   config.Config
	log   hclog.Logger
	ready atomic.Bool
}

// New returns a launcher; it does nothing until Run.
func New(cfg config.Config, log hclog.Logger) *Launcher { return &Launcher{cfg: cfg, log: log} }

// Ready reports nil once the bootstrap is written (and Envoy started, if configured).
func (l *Launcher) Ready() error {
	if !l.ready.Load() {
		return errors.New("waiting for the sds and xds sockets")
	}
	return nil
}

// Run waits for the sockets, writes the bootstrap and runs Envoy until ctx ends.
func (l *Launcher) Run(ctx context.Context) error {
	for _, s := range []string{l.cfg.SDSSocket, l.cfg.XDSSocket} {
		if err := waitSocket(ctx, s, l.cfg.WaitFor); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	b, err := bootstrap.Build(bootstrap.Params{
		NodeID: "sidecar~" + l.cfg.Pod.ID, Cluster: l.cfg.Pod.ID,
		SDSSocket: l.cfg.SDSSocket, XDSSocket: l.cfg.XDSSocket, AdminAddr: l.cfg.Envoy.AdminAddr,
	})
	if err != nil {
		return err
	}
	if err := bootstrap.Write(l.cfg.Envoy.BootstrapPath, b); err != nil {
		return err
	}
	l.log.Info("bootstrap written", "path", l.cfg.Envoy.BootstrapPath)
	if l.cfg.Envoy.Binary == "" {
		l.ready.Store(true)
		l.log.Info("no envoy binary configured: not starting envoy")
		<-ctx.Done()
		return nil
	}
	return l.runEnvoy(ctx)
}

func (l *Launcher) runEnvoy(ctx context.Context) error {
	cmd := exec.Command(l.cfg.Envoy.Binary, "-c", l.cfg.Envoy.BootstrapPath,
		"--drain-time-s", strconv.Itoa(int(l.cfg.Envoy.DrainTime.Seconds())), "--drain-strategy", "immediate")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start envoy: %w", err)
	}
	l.log.Info("envoy started", "pid", cmd.Process.Pid)
	l.ready.Store(true)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		l.ready.Store(false)
		return fmt.Errorf("envoy exited: %w", err)
	case <-ctx.Done():
	}
	l.ready.Store(false)
	l.drain()
	timer := time.NewTimer(l.cfg.Envoy.DrainTime)
	defer timer.Stop()
	select {
	case <-exited:
		return nil
	case <-timer.C:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	return nil
}

// drain asks Envoy's admin to drain listeners gracefully, as Istio's agent does.
func (l *Launcher) drain() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+l.cfg.Envoy.AdminAddr+"/drain_listeners?graceful", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		l.log.Warn("drain request failed", "error", err)
		return
	}
	_ = resp.Body.Close()
	l.log.Info("envoy draining", "for", l.cfg.Envoy.DrainTime)
}

func waitSocket(ctx context.Context, path string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("socket %s not ready after %s: %w", path, limit, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
