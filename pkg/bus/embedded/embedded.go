// Package embedded runs a nats-server with JetStream inside the calling process: the
// default bus for local runs (meshctl up) and for tests.
package embedded

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/nats-io/nats-server/v2/server"
)

// Config says where the embedded server listens and keeps its state.
type Config struct {
	Host     string // default 127.0.0.1
	Port     int    // -1 picks a free port
	StoreDir string // JetStream state; empty disables JetStream
	// Name is the server's name (default meshagent-embedded); servers joined by
	// leaf connections need names of their own.
	Name string
	// DontListen skips TCP entirely: only in-process connections (nats.InProcessServer).
	DontListen bool
	Logger     hclog.Logger // nil: silent
	// Auth, when set, secures the server with the role table of pkg/bus/policy for
	// these keys: accounts, nkey users, permissions and the auth callout for pods.
	// Nil runs an open bus (only for tests of code that is not about the bus).
	Auth *policy.Keys
	// TLS, when set, is the client listener's TLS. With ClientAuth
	// tls.RequestClientCert a client may present a certificate, which nats-server
	// hands to the auth callout (a pod's mesh certificate admits it without a token);
	// the callout, not the server, verifies it.
	TLS *tls.Config
	// AllowNonTLS keeps plaintext clients beside TLS ones (the loopback dev stack,
	// whose services connect in plaintext). Without it, TLS is required.
	AllowNonTLS bool
	// LeafPort, when not 0, accepts leaf node connections there (-1 picks a free
	// port; LeafAddr tells which): the node tier's node agents connect to the hub
	// here, each admitted by the auth callout by its node's token (policy.Node).
	LeafPort int
	// LeafTLS, when set, is the leaf listener's TLS (a fleet's nodes reach the hub
	// across the network); nil accepts leaf connections in plaintext (loopback).
	LeafTLS *tls.Config
	// MonitorPort, when not 0, serves nats-server's HTTP monitoring (/varz,
	// /connz, /leafz) on Host there (-1 picks a free port; MonitorAddr tells
	// which): what a storm reads the hub's connections from.
	MonitorPort int
	// Leaf, when set, makes this server a node tier's leaf node instead of a hub:
	// no JetStream, its clients (the node's pods) admitted by Leaf.Admit inside
	// the server, and one remote connection to the hub (docs/scale.md, "The node
	// tier"). Auth is ignored.
	Leaf *Leaf
}

// Leaf is the node-tier side of a leaf node connection.
type Leaf struct {
	// Admit admits each client, in the mesh account (leafAuth).
	Admit LeafAdmit
	// Remote is the hub's leaf URL.
	Remote *url.URL
	// Token gives the node's credential when the server starts or reloads
	// (Reload): the leaf sends it as the CONNECT's auth token, which the hub
	// hands to its auth callout. (In server-configuration mode nats-server drops
	// a CONNECT's JWT before the callout sees it, so the token cannot ride in
	// the connect-time signature hook, which would read it afresh.)
	Token func() (string, error)
	// RemoteTLS, when set, dials the hub in TLS.
	RemoteTLS *tls.Config
}

// nats-server limits on what waits in its memory (see Start); the same in the
// fleet's configuration (deploy/).
const (
	StreamMaxBufferedSize = 4 << 20
	StreamMaxBufferedMsgs = 4_096
	MaxPending            = 8 << 20
)

// EmbeddedAuthTimeout is the embedded server's auth timeout: from the end of a
// client's TLS handshake (its accept, in plaintext) to its CONNECT, and for the
// auth callout's answer. Longer than a file-configured server's
// (policy.AuthTimeout), which must answer before the short first PING this
// server does not send. Measured: at 10,000 pods connecting at once, 2 s wasted
// 1,656 admissions and 5 s none (docs/scale.md).
const EmbeddedAuthTimeout = 5 * time.Second

// LeafAuthTimeout is a node's leaf server's auth timeout: from a pod's accept to
// its CONNECT, admitted inside the server (Leaf.Admit). Below the pods' connect
// timeout on the node (bus.NodeLocalConnectTimeout, a minute), above what a
// node busy admitting all of its pods at once needs: a pod slowed by the same
// busy cores is waited for, not cut off to come back and start again.
const LeafAuthTimeout = 30 * time.Second

// EmbeddedTLSTimeout is how long the embedded server gives a client's TLS
// handshake (nats-server's default is 2 s). In a storm every accepted connection
// handshakes at once on shared cores, each taking about N × its cost ÷ cores;
// at 2 s a wave failed together and came back, the same handshakes done again.
// With the auth timer, which starts when the handshake ends, it adds up to the
// clients' connect timeout (bus.ConnectTimeout, 10 s). Measured side by side
// (docs/scale.md, "The embedded server's TLS timeout"): 5,000 pods at once in
// 29.0–38.1 s against 41.2–49.6 s with 2 s, half the reconnects; at 10,000 pods
// a wash in time, with more admissions wasted. 3 s was no better than 2 s, and
// nats-server's tls connection_rate_limit (150 or 300 a second) slower.
const EmbeddedTLSTimeout = 5 * time.Second

// Start starts the server and waits until it accepts connections.
func Start(c Config) (*server.Server, error) {
	opts, err := options(c, clock.Real{})
	if err != nil {
		return nil, err
	}
	return start(c, opts)
}

// Reload applies c, as Start would have, to the running server s: a node agent
// renews its hub connection with its new token this way. nats-server closes the
// connections Leaf.Admit admitted when it reloads (their users are not in its
// configuration; they reconnect and are admitted again on the node): a token
// rotation costs each pod of the node a reconnect to its own node, never to the
// hub. The server keeps the Admit it started with.
func Reload(s *server.Server, c Config) error {
	opts, err := options(c, clock.Real{})
	if err != nil {
		return err
	}
	if err := s.ReloadOptions(opts); err != nil {
		return fmt.Errorf("embedded nats: reload: %w", err)
	}
	return nil
}

// options are the server options c asks for.
func options(c Config, clk clock.Clock) (*server.Options, error) {
	if c.Host == "" {
		c.Host = "127.0.0.1"
	}
	opts := &server.Options{}
	if c.Leaf != nil {
		if err := leafOptions(opts, c.Leaf, clk); err != nil {
			return nil, err
		}
		c.Auth, c.StoreDir = nil, ""
	}
	if c.Auth != nil {
		conf, err := policy.Render(*c.Auth)
		if err != nil {
			return nil, fmt.Errorf("embedded nats: %w", err)
		}
		if err := opts.ProcessConfigString(conf); err != nil {
			return nil, fmt.Errorf("embedded nats: auth config: %w", err)
		}
	}
	opts.ServerName = c.Name
	if opts.ServerName == "" {
		opts.ServerName = "meshagent-embedded"
	}
	opts.Host = c.Host
	opts.Port = c.Port
	opts.DontListen = c.DontListen
	opts.NoSigs = true
	opts.NoLog = c.Logger == nil
	// The largest message any client may send, as deploy/kubernetes's servers. A
	// callout-admitted pod's user JWT carries a smaller bound (policy.PodLimits),
	// which nats-server v2.15 does not apply in server-configuration mode; the
	// streams' MaxMsgSize bounds what is kept (docs/security.md).
	opts.MaxPayload = 1 << 20
	// One client's flood must not become the server's memory (issue 37: a pod's
	// event flood took the process hosting the server from 43 to 778 MiB). Each
	// stream queues what it has not stored yet up to StreamMaxBuffered* (128 MiB and
	// 100,000 messages by default; beyond, the publish is refused), and a client's
	// outbound data waits up to MaxPending (64 MiB by default; beyond, it is a slow
	// consumer and is disconnected). deploy/ sets the same.
	opts.StreamMaxBufferedSize = StreamMaxBufferedSize
	opts.StreamMaxBufferedMsgs = StreamMaxBufferedMsgs
	opts.MaxPending = MaxPending
	// A new client's first PING comes only after the ping interval, not 2 s after
	// its CONNECT: a client admitted by a slow auth callout (a storm) must get its
	// PONG before any PING, or nats.go fails the connect the callout admitted
	// (policy.AuthTimeout). A file-configured server cannot set this; there
	// AuthTimeout alone keeps the answer within the first ping. Here, without
	// that race, the server can wait longer (EmbeddedAuthTimeout), for the TLS
	// handshake and CONNECT of a client it accepted late as for the callout.
	opts.DisableShortFirstPing = true
	if c.Auth != nil {
		opts.AuthTimeout = EmbeddedAuthTimeout.Seconds()
	}
	if c.Leaf != nil {
		opts.AuthTimeout = LeafAuthTimeout.Seconds()
	}
	if c.LeafPort != 0 {
		opts.LeafNode.Host = c.Host
		opts.LeafNode.Port = c.LeafPort
		if c.LeafTLS != nil {
			opts.LeafNode.TLSConfig = c.LeafTLS
			opts.LeafNode.TLSTimeout = EmbeddedTLSTimeout.Seconds()
		}
	}
	if c.MonitorPort != 0 {
		opts.HTTPHost = c.Host
		opts.HTTPPort = c.MonitorPort
	}
	if c.TLS != nil {
		opts.TLSConfig = c.TLS
		opts.TLSTimeout = EmbeddedTLSTimeout.Seconds()
		opts.AllowNonTLS = c.AllowNonTLS
	}
	if c.StoreDir != "" {
		opts.JetStream = true
		opts.StoreDir = c.StoreDir
	}
	return opts, nil
}

func start(c Config, opts *server.Options) (*server.Server, error) {
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if a, ok := opts.CustomClientAuthentication.(*leafAuth); ok {
		a.srv.Store(s) // before the listener: no client is admitted without it
	}
	if c.Logger != nil {
		s.SetLoggerV2(&logAdapter{l: c.Logger}, false, false, false)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded nats: not ready after 10s")
	}
	return s, nil
}

// leafOptions makes opts a node tier's leaf server: the mesh account
// (policy.RenderLeaf), its clients admitted by l.Admit (leafAuth), and the remote
// to the hub binding the mesh account to the account the hub admits the node into.
// On Reload nats-server keeps the authentication the server started with.
func leafOptions(opts *server.Options, l *Leaf, clk clock.Clock) error {
	if l.Admit == nil {
		return errNoAdmit
	}
	opts.CustomClientAuthentication = &leafAuth{admit: l.Admit, clk: clk}
	if err := opts.ProcessConfigString(policy.RenderLeaf()); err != nil {
		return fmt.Errorf("embedded nats: leaf auth config: %w", err)
	}
	if l.Remote == nil || l.Remote.Host == "" || l.Remote.User != nil {
		return fmt.Errorf("embedded nats: leaf: want a hub URL without credentials")
	}
	if l.Token == nil {
		return fmt.Errorf("embedded nats: leaf: no token")
	}
	tok, err := l.Token()
	if err != nil {
		return fmt.Errorf("embedded nats: leaf: %w", err)
	}
	remote := *l.Remote
	remote.User = url.User(tok)
	opts.LeafNode.Remotes = []*server.RemoteLeafOpts{{
		LocalAccount: policy.AccountMesh,
		URLs:         []*url.URL{&remote},
		TLS:          l.RemoteTLS != nil,
		TLSConfig:    l.RemoteTLS,
	}}
	// A hub restart: the node reconnects soon, its pods stay connected to it.
	opts.LeafNode.ReconnectInterval = time.Second
	return nil
}

// LeafAddr is the host:port s accepts leaf node connections on ("" without).
func LeafAddr(s *server.Server) string {
	v, err := s.Varz(nil)
	if err != nil || v.LeafNode.Port == 0 {
		return ""
	}
	return net.JoinHostPort(v.LeafNode.Host, strconv.Itoa(v.LeafNode.Port))
}

// MonitorAddr is the host:port s serves HTTP monitoring on ("" without).
func MonitorAddr(s *server.Server) string {
	if a := s.MonitorAddr(); a != nil {
		return a.String()
	}
	return ""
}

// logAdapter sends nats-server's log lines to hclog.
type logAdapter struct{ l hclog.Logger }

func (a *logAdapter) Noticef(format string, v ...any) { a.l.Debug(fmt.Sprintf(format, v...)) }
func (a *logAdapter) Warnf(format string, v ...any)   { a.l.Warn(fmt.Sprintf(format, v...)) }
func (a *logAdapter) Fatalf(format string, v ...any)  { a.l.Error(fmt.Sprintf(format, v...)) }
func (a *logAdapter) Errorf(format string, v ...any)  { a.l.Error(fmt.Sprintf(format, v...)) }
func (a *logAdapter) Debugf(format string, v ...any)  { a.l.Trace(fmt.Sprintf(format, v...)) }
func (a *logAdapter) Tracef(format string, v ...any)  { a.l.Trace(fmt.Sprintf(format, v...)) }
