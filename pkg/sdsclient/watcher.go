package sdsclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/clock"
	"google.golang.org/grpc"
)

// ErrNotReady is returned by Watcher accessors before the secret has arrived.
var ErrNotReady = errors.New("sdsclient: secret not received yet")

// Watcher keeps the latest `default` certificate and `ROOTCA` bundle from one
// StreamSecrets stream, reconnecting with backoff. Its accessors are safe for
// concurrent use; use Certificate in tls.Config.GetCertificate/GetClientCertificate
// so that every handshake uses the current key.
type Watcher struct {
	cc     grpc.ClientConnInterface
	socket string // when set, Run dials it instead of using cc
	node   string
	log    hclog.Logger

	// MinBackoff and MaxBackoff bound the reconnect delay (defaults 50ms and 5s).
	MinBackoff, MaxBackoff time.Duration
	// Clock times the reconnect delays (default: the wall clock).
	Clock clock.Clock

	mu      sync.Mutex
	cert    *tls.Certificate
	certSrc Secret
	roots   *x509.CertPool
	rootSrc Secret
	changed chan struct{} // closed and replaced on every update
	ready   chan struct{} // closed once both are in hand
}

// NewWatcher returns a Watcher for node nodeID over cc. It does nothing until Run.
func NewWatcher(cc grpc.ClientConnInterface, nodeID string, log hclog.Logger) *Watcher {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Watcher{cc: cc, node: nodeID, log: log, MinBackoff: 50 * time.Millisecond, MaxBackoff: 5 * time.Second, Clock: clock.Real{},
		changed: make(chan struct{}), ready: make(chan struct{})}
}

// WatchUnix returns a Watcher of the SDS server on the unix socket at path for
// node nodeID. It does nothing until Run, which dials the socket (the server need
// not be up yet: streams retry) and closes the connection when it returns.
func WatchUnix(path, nodeID string, log hclog.Logger) *Watcher {
	w := NewWatcher(nil, nodeID, log)
	w.socket = path
	return w
}

// Run streams `default` and `ROOTCA` until ctx ends, reconnecting with exponential
// backoff and jitter. It returns nil on cancellation.
func (w *Watcher) Run(ctx context.Context) error {
	cc := w.cc
	if w.socket != "" {
		conn, err := DialUnix(ctx, w.socket)
		if err != nil {
			return fmt.Errorf("sds server at %s: %w", w.socket, err)
		}
		defer conn.Close()
		cc = conn
	}
	retry := backoff.Policy{First: w.MinBackoff, Max: w.MaxBackoff, Jitter: 0.5}.Start()
	for {
		got, err := w.once(ctx, cc)
		if ctx.Err() != nil {
			return nil
		}
		if got {
			retry.Reset()
		}
		w.log.Warn("sds stream ended", "error", err, "retry_in", retry.Current())
		if !backoff.Wait(ctx, w.Clock, retry.Next()) {
			return nil
		}
	}
}

// once runs one stream; got reports whether anything was received.
func (w *Watcher) once(ctx context.Context, cc grpc.ClientConnInterface) (got bool, err error) {
	st, err := Open(ctx, cc, w.node, ResourceDefault, ResourceRootCA)
	if err != nil {
		return false, err
	}
	defer st.Close()
	for {
		resp, err := st.RecvRaw()
		if err != nil {
			return got, err
		}
		got = true
		u, err := Decode(resp)
		if err == nil {
			err = w.apply(u)
		}
		if err != nil {
			w.log.Warn("rejecting sds response", "version", resp.VersionInfo, "error", err)
			if err := st.Nack(resp, err.Error()); err != nil {
				return got, err
			}
			continue
		}
		if err := st.Ack(resp); err != nil {
			return got, err
		}
	}
}

// apply checks every secret in u and, if all are good, installs them together.
func (w *Watcher) apply(u Update) error {
	var cert *tls.Certificate
	var roots *x509.CertPool
	for name, s := range u.Secrets {
		switch name {
		case ResourceDefault:
			c, err := tls.X509KeyPair(s.CertChain, s.PrivateKey)
			if err != nil {
				return fmt.Errorf("secret %q: %w", name, err)
			}
			if c.Leaf == nil {
				if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
					return fmt.Errorf("secret %q: %w", name, err)
				}
			}
			cert = &c
		case ResourceRootCA:
			p := x509.NewCertPool()
			if !p.AppendCertsFromPEM(s.TrustedCA) {
				return fmt.Errorf("secret %q: no certificates in trusted_ca", name)
			}
			roots = p
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if cert != nil {
		w.cert, w.certSrc = cert, u.Secrets[ResourceDefault]
	}
	if roots != nil {
		w.roots, w.rootSrc = roots, u.Secrets[ResourceRootCA]
	}
	if cert == nil && roots == nil {
		return nil
	}
	close(w.changed)
	w.changed = make(chan struct{})
	if w.cert != nil && w.roots != nil {
		select {
		case <-w.ready:
		default:
			close(w.ready)
		}
	}
	w.log.Debug("secrets updated", "version", u.Version, "certificate", cert != nil, "roots", roots != nil)
	return nil
}

// Certificate returns the current `default` certificate and key.
func (w *Watcher) Certificate() (*tls.Certificate, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cert == nil {
		return nil, ErrNotReady
	}
	return w.cert, nil
}

// Roots returns the current `ROOTCA` pool.
func (w *Watcher) Roots() (*x509.CertPool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.roots == nil {
		return nil, ErrNotReady
	}
	return w.roots, nil
}

// RootsPEM returns the current `ROOTCA` bundle as PEM.
func (w *Watcher) RootsPEM() ([]byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.roots == nil {
		return nil, ErrNotReady
	}
	return append([]byte(nil), w.rootSrc.TrustedCA...), nil
}

// Changed returns a channel that is closed at the next update of either secret. Call
// it again after each notification (like context.Done, it is a one-shot broadcast).
func (w *Watcher) Changed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

// Ready returns a channel closed once both `default` and `ROOTCA` are in hand.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// GetCertificate suits tls.Config.GetCertificate.
func (w *Watcher) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return w.Certificate()
}

// GetClientCertificate suits tls.Config.GetClientCertificate.
func (w *Watcher) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return w.Certificate()
}
