// Package nodeagent is the node agent, importable: a NATS leaf node for one
// Kubernetes node (pkg/bus/embedded), admitting the node's pods inside the
// server (internal/admit), and the node's own admission to the hub by its token, read
// again as the kubelet rotates it. Built and run the one way every meshagent
// service is (pkg/lifecycle): Load → New(cfg, Deps) → Run.
package nodeagent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/services/node-agent/internal/admit"
	"github.com/meshagent/meshagent/services/node-agent/internal/config"
	"github.com/nats-io/nats-server/v2/server"
)

// Config is the node agent's whole configuration.
type Config = config.Config

// Load reads the configuration from flags and env vars over the defaults and
// validates it.
func Load(args []string, getenv func(string) string) (Config, error) {
	return config.Load(args, getenv)
}

// Agent is one node's agent.
type Agent struct {
	cfg   Config
	d     lifecycle.Deps
	admit *admit.Admission
	keys  *authn.KeySet // the pods' token keys, nil with TokenReview
	// tokensReady is nil once pods' tokens can be verified (their keys loaded).
	tokensReady func() error
	hubTLS      *tls.Config

	mu     sync.Mutex
	ecfg   embedded.Config // the leaf server's, for a reload with a new token
	srv    *server.Server
	token  string
	remote *url.URL
}

// New builds the agent from cfg and d; it starts nothing.
func New(cfg Config, d lifecycle.Deps) (*Agent, error) {
	d = d.WithDefaults()
	tv, keys, err := cfg.Auth.Build(cfg.TrustDomain, d.Clock, d.Log)
	if err != nil {
		return nil, fmt.Errorf("node agent: %w", err)
	}
	if tv == nil {
		return nil, errors.New("node agent: no way to verify pods' tokens (-jwks-file, -jwks-url, -token-issuer-discovery or -token-review)")
	}
	return NewWith(cfg, d, admit.Tokens{Verifier: tv}, keys)
}

// NewWith is New with the pods' tokens verified by v (keys, when not nil, is
// the key set v reads, run with the agent).
func NewWith(cfg Config, d lifecycle.Deps, v admit.Verifier, keys *authn.KeySet) (*Agent, error) {
	d = d.WithDefaults()
	a := &Agent{cfg: cfg, d: d, keys: keys, admit: admit.New(cfg.Node, v, cfg.Pods, d.Clock, d.Log.Named("admit"), d.Metrics)}
	if cfg.Hub.CAFile != "" {
		pem, err := os.ReadFile(cfg.Hub.CAFile)
		if err != nil {
			return nil, fmt.Errorf("node agent: -hub-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("node agent: -hub-ca %s: no certificate", cfg.Hub.CAFile)
		}
		a.hubTLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	a.tokensReady = func() error { return nil }
	if t, ok := v.(admit.Tokens); ok {
		a.tokensReady = t.Verifier.Ready
	}
	d.Health.AddReadyCheck("node", a.Ready)
	return a, nil
}

// Addr is where the node's pods connect, once Run has started the server.
func (a *Agent) Addr() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.srv == nil {
		return ""
	}
	return a.srv.Addr().String()
}

// Ready is nil once the agent admits pods: its leaf server runs and holds its hub
// connection (a node whose hub is away keeps its pods connected, not ready), and
// it can verify tokens.
func (a *Agent) Ready() error {
	if err := a.connected(); err != nil {
		return err
	}
	if err := a.tokensReady(); err != nil {
		return fmt.Errorf("pods' tokens: %w", err)
	}
	return nil
}

func (a *Agent) connected() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.srv == nil {
		return errors.New("leaf server not started")
	}
	if a.srv.NumLeafNodes() == 0 {
		return errors.New("not connected to the hub")
	}
	return nil
}

// Run starts the leaf server, which admits the node's pods, and follows the token file, until
// ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.readToken(); err != nil {
		return err
	}
	if a.keys != nil {
		// The pods' token keys first: before them, every pod would be refused.
		if err := a.keys.Load(ctx); err != nil {
			return fmt.Errorf("node agent: pods' token keys: %w", err)
		}
	}
	srv, err := a.start()
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	a.d.Log.Info("node tier up", "pods", srv.Addr().String(), "hub", a.cfg.Hub.URL)
	tasks := []func(context.Context) error{a.followToken}
	if a.keys != nil {
		tasks = append(tasks, a.keys.Run)
	}
	return lifecycle.Tasks(ctx, tasks...)
}

func (a *Agent) start() (*server.Server, error) {
	host, port, err := net.SplitHostPort(a.cfg.Listen.NATS)
	if err != nil {
		return nil, fmt.Errorf("node agent: -listen: %w", err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("node agent: -listen port: %w", err)
	}
	if p == 0 {
		p = -1
	}
	ecfg := embedded.Config{Name: "node-" + a.cfg.Node, Host: host, Port: p, Logger: a.d.Log.Named("nats"), Leaf: a.leaf()}
	srv, err := embedded.Start(ecfg)
	if err != nil {
		return nil, fmt.Errorf("node agent: %w", err)
	}
	ecfg.Port = srv.Addr().(*net.TCPAddr).Port
	a.mu.Lock()
	a.srv, a.ecfg = srv, ecfg
	a.mu.Unlock()
	return srv, nil
}

// leaf is the leaf side of the hub connection with the token now held.
func (a *Agent) leaf() *embedded.Leaf {
	a.mu.Lock()
	defer a.mu.Unlock()
	tok := a.token
	return &embedded.Leaf{Admit: a.admit.Admit, Remote: a.remote, RemoteTLS: a.hubTLS,
		Token: func() (string, error) { return tok, nil }}
}

// readToken reads the token file into the hub URL the leaf dials.
func (a *Agent) readToken() error {
	b, err := os.ReadFile(a.cfg.Hub.TokenFile)
	if err != nil {
		return fmt.Errorf("node agent: token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return fmt.Errorf("node agent: token file %s is empty", a.cfg.Hub.TokenFile)
	}
	u, err := url.Parse(a.cfg.Hub.URL)
	if err != nil {
		return fmt.Errorf("node agent: -hub: %w", err)
	}
	a.mu.Lock()
	a.token, a.remote = tok, u
	a.mu.Unlock()
	return nil
}

// followToken reads the token file every -token-reread; a new token reconnects
// the node to the hub with it before the old one, and the user the hub gave for
// it, expire (embedded.Reload: the node's pods reconnect to the node with it).
func (a *Agent) followToken(ctx context.Context) error {
	for backoff.Wait(ctx, a.d.Clock, a.cfg.Hub.Reread) {
		a.mu.Lock()
		old := a.token
		a.mu.Unlock()
		if err := a.readToken(); err != nil {
			a.d.Log.Warn("token not read again; keeping the one held", "error", err)
			continue
		}
		a.mu.Lock()
		changed, srv, ecfg := a.token != old, a.srv, a.ecfg
		a.mu.Unlock()
		if !changed {
			continue
		}
		ecfg.Leaf = a.leaf()
		if err := embedded.Reload(srv, ecfg); err != nil {
			a.d.Log.Error("new token not applied to the hub connection", "error", err)
			continue
		}
		a.d.Log.Info("hub connection renewed with a new token")
	}
	return nil
}
