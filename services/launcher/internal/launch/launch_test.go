package launch

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/services/launcher/internal/config"
)

func listenUnix(t *testing.T, path string) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
}

func TestWritesBootstrapOnceBothSocketsAnswer(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Pod.ID = "web-0"
	cfg.SDSSocket = filepath.Join(dir, "sds.sock")
	cfg.XDSSocket = filepath.Join(dir, "xds.sock")
	cfg.Envoy.BootstrapPath = filepath.Join(dir, "envoy.json")
	cfg.WaitFor = 30 * time.Second
	l := New(cfg, hclog.NewNullLogger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()

	listenUnix(t, cfg.SDSSocket)
	if l.Ready() == nil {
		t.Fatal("ready with only the sds socket")
	}
	listenUnix(t, cfg.XDSSocket)
	deadline := time.Now().Add(20 * time.Second)
	for l.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatal("not ready after both sockets answered")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(cfg.Envoy.BootstrapPath); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestGivesUpWhenSocketNeverAppears(t *testing.T) {
	cfg := config.Default()
	cfg.Pod.ID = "web-0"
	cfg.SDSSocket = filepath.Join(t.TempDir(), "none.sock")
	cfg.WaitFor = 200 * time.Millisecond
	if err := New(cfg, hclog.NewNullLogger()).Run(context.Background()); err == nil {
		t.Fatal("want error")
	}
}
