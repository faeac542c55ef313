// Package upstream dials the discovery server for the relay: plaintext or TLS,
// with the workload certificate from sds-edge for mTLS, a trust bundle that is
// rebuilt when the mesh's roots change, and the per-stream metadata (bearer
// token, ClusterID, XDS_HEADER_*).
//
// Relayed streams share one HTTP/2 connection per TLS generation: every rebuild
// (trust change, new workload certificate, new anchors) retires the current
// connection, so new streams dial with the new configuration while the streams on
// the old one run on; the old connection closes when its last stream ends.
// Reachability keeps the current connection connected before any stream and
// reports whether the discovery server is reachable.
package upstream

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// windowSize is the HTTP/2 flow-control window of upstream streams and
// connections (the relay's WindowSize; this package cannot import the relay).
const windowSize = 1 << 20

// Security modes of the upstream connection.
const (
	Plaintext = "plaintext"
	TLS       = "tls"  // verify the server
	MTLS      = "mtls" // verify the server and present the workload certificate
)

// SystemRoots as the root CA file means the host's trust store, as Istio's XDS_ROOT_CA=SYSTEM.
const SystemRoots = "SYSTEM"

// Config says how to reach the discovery server.
type Config struct {
	Address    string
	Mode       string // Plaintext, TLS or MTLS
	RootCAFile string // PEM file; SystemRoots; empty: the mesh roots from sds-edge
	ServerName string // empty: the host part of Address
	TokenFile  string // re-read on every connection; empty: no token
	ClusterID  string
	Headers    map[string]string // extra metadata
	MaxMsgSize int
	// ConnectTimeout bounds a connection attempt, including the TLS and HTTP/2
	// handshakes, so an upstream that accepts and never answers fails the stream.
	ConnectTimeout time.Duration
}

// Material is the pod's workload certificate and mesh roots, as sds-edge serves
// them (sdsclient.Watcher implements it).
type Material interface {
	Certificate() (*tls.Certificate, error)
	Roots() (*x509.CertPool, error)
}

// Dialer opens upstream connections with the current TLS configuration.
type Dialer struct {
	cfg Config
	mat Material
	log hclog.Logger

	mu         sync.Mutex
	tls        *tls.Config // nil until the first successful build (or in plaintext)
	anchors    []*x509.Certificate
	meshRoots  []*x509.Certificate // from the newest trust.changed
	generation uint64
	rebuilds   int
	conn       *sharedConn // nil: dial a new one for the next stream
}

// sharedConn is one upstream connection and the streams on it.
type sharedConn struct {
	cc      *grpc.ClientConn
	refs    int
	retired bool
	gone    chan struct{} // closed when retired
}

// New returns a Dialer. mat may be nil unless the mode needs the workload
// certificate (MTLS) or the mesh roots (TLS without a root CA file).
func New(cfg Config, mat Material, log hclog.Logger) (*Dialer, error) {
	switch cfg.Mode {
	case Plaintext, TLS, MTLS:
	default:
		return nil, fmt.Errorf("upstream: unknown mode %q", cfg.Mode)
	}
	if cfg.Mode != Plaintext && mat == nil && (cfg.Mode == MTLS || cfg.RootCAFile == "") {
		return nil, errors.New("upstream: tls material from sds-edge required")
	}
	return &Dialer{cfg: cfg, mat: mat, log: log}, nil
}

// Address is the discovery server's address.
func (d *Dialer) Address() string { return d.cfg.Address }

// Rebuild rebuilds the TLS configuration from the current trust material: the root
// CA file (re-read), or sds-edge's ROOTCA plus the roots of the newest
// trust.changed, plus any extra anchors. Existing connections keep theirs.
func (d *Dialer) Rebuild(reason string) error {
	if d.cfg.Mode == Plaintext {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rebuildLocked(reason)
}

func (d *Dialer) rebuildLocked(reason string) error {
	pool, err := d.pool()
	if err != nil {
		return fmt.Errorf("upstream trust bundle: %w", err)
	}
	for _, c := range d.anchors {
		pool.AddCert(c)
	}
	serverName := d.cfg.ServerName
	if serverName == "" {
		if h, _, err := net.SplitHostPort(d.cfg.Address); err == nil {
			serverName = h
		}
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: serverName}
	if d.cfg.Mode == MTLS {
		mat := d.mat
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return mat.Certificate() }
	}
	d.tls = c
	d.rebuilds++
	d.retireLocked()
	d.log.Info("upstream tls configuration built", "reason", reason, "rebuilds", d.rebuilds)
	return nil
}

func (d *Dialer) pool() (*x509.CertPool, error) {
	switch d.cfg.RootCAFile {
	case SystemRoots:
		return x509.SystemCertPool()
	case "":
		p, err := d.mat.Roots()
		if err != nil {
			return nil, fmt.Errorf("mesh roots from sds-edge: %w", err)
		}
		p = p.Clone()
		for _, c := range d.meshRoots {
			p.AddCert(c)
		}
		return p, nil
	default:
		b, err := os.ReadFile(d.cfg.RootCAFile)
		if err != nil {
			return nil, fmt.Errorf("read root ca: %w", err)
		}
		p := x509.NewCertPool()
		if !p.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("root ca %s: no PEM certificates", d.cfg.RootCAFile)
		}
		return p, nil
	}
}

// TrustChanged takes the mesh's new roots (from trust.changed) and rebuilds.
// Older generations than the newest seen are ignored. With a root CA file the
// file is re-read and the mesh roots are not added: the operator pinned the CA.
func (d *Dialer) TrustChanged(generation uint64, roots []*x509.Certificate) error {
	if d.cfg.Mode == Plaintext {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if generation != 0 && generation < d.generation {
		return nil
	}
	d.generation = generation
	if d.cfg.RootCAFile == "" {
		d.meshRoots = roots
	}
	return d.rebuildLocked(fmt.Sprintf("trust changed (generation %d)", generation))
}

// SetAnchors replaces the extra trust anchors (from Istio's ProxyConfig) and rebuilds.
func (d *Dialer) SetAnchors(certs []*x509.Certificate) error {
	if d.cfg.Mode == Plaintext {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.anchors = certs
	return d.rebuildLocked("trust anchors")
}

// retireLocked stops handing out the current connection; it closes once unused.
func (d *Dialer) retireLocked() {
	if d.conn == nil {
		return
	}
	d.conn.retired = true
	close(d.conn.gone)
	if d.conn.refs == 0 {
		_ = d.conn.cc.Close()
	}
	d.conn = nil
}

// Close closes the current connection once its streams have ended.
func (d *Dialer) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.retireLocked()
}

func (d *Dialer) currentLocked() (*tls.Config, error) {
	if d.tls == nil {
		if err := d.rebuildLocked("first connection"); err != nil {
			return nil, err
		}
	}
	return d.tls.Clone(), nil
}

// Dial returns the connection for one relayed stream, the metadata to send on it
// and a release func to call when the stream has ended. gRPC connects it on the
// first stream, or earlier when Reachability asks it to (the relay's Run does).
func (d *Dialer) Dial(context.Context) (*grpc.ClientConn, metadata.MD, func(), error) {
	md, err := d.metadata()
	if err != nil {
		return nil, nil, nil, err
	}
	sc, release, err := d.take()
	if err != nil {
		return nil, nil, nil, err
	}
	return sc.cc, md, release, nil
}

// Shared returns the connection new streams get (as Dial, without the per-stream
// metadata), a channel closed when the Dialer retires it (a TLS rebuild, Close)
// and a release func to call when done with it. Holding it keeps the connection
// open, as a stream does.
func (d *Dialer) Shared() (*grpc.ClientConn, <-chan struct{}, func(), error) {
	sc, release, err := d.take()
	if err != nil {
		return nil, nil, nil, err
	}
	return sc.cc, sc.gone, release, nil
}

// take returns the current connection, dialling one if there is none, with one
// more reference on it.
func (d *Dialer) take() (*sharedConn, func(), error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn == nil {
		cc, err := d.dialLocked()
		if err != nil {
			return nil, nil, err
		}
		d.conn = &sharedConn{cc: cc, gone: make(chan struct{})}
	}
	sc := d.conn
	sc.refs++
	var once sync.Once
	release := func() {
		once.Do(func() {
			d.mu.Lock()
			defer d.mu.Unlock()
			sc.refs--
			if sc.retired && sc.refs == 0 {
				_ = sc.cc.Close()
			}
		})
	}
	return sc, release, nil
}

func (d *Dialer) dialLocked() (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if d.cfg.Mode != Plaintext {
		c, err := d.currentLocked()
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(c)
	}
	bo := backoff.DefaultConfig
	bo.MaxDelay = 5 * time.Second
	cc, err := grpc.NewClient(d.cfg.Address,
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: d.cfg.ConnectTimeout}),
		// Never idle: the reachability watch holds the connection warm for
		// Envoy's first stream and reports on it (reachability.go).
		grpc.WithIdleTimeout(0),
		// A fixed window, as the relay's own side has (relay.WindowSize): no BDP pings.
		grpc.WithInitialWindowSize(windowSize),
		grpc.WithInitialConnWindowSize(windowSize),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(d.cfg.MaxMsgSize), grpc.MaxCallSendMsgSize(d.cfg.MaxMsgSize)),
	)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", d.cfg.Address, err)
	}
	return cc, nil
}

// metadata builds the per-connection metadata; the token file is read every time,
// so a rotated token is used by the next connection.
func (d *Dialer) metadata() (metadata.MD, error) {
	md := metadata.MD{}
	for k, v := range d.cfg.Headers {
		md.Set(k, v)
	}
	if d.cfg.ClusterID != "" {
		md.Set("ClusterID", d.cfg.ClusterID)
	}
	if d.cfg.TokenFile != "" {
		b, err := os.ReadFile(d.cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("read token: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return nil, fmt.Errorf("token file %s is empty", d.cfg.TokenFile)
		}
		md.Set("authorization", "Bearer "+tok)
	}
	return md, nil
}
