package lifecycle

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/nats-io/nats.go"
)

// SharedBus lets services hosted in one process (a pod's three roles in
// `meshagent pod`) use one bus connection instead of one each: a third of the
// connections, admissions by the auth callout, pings and server memory. Services
// share a connection when their bus configs name the same servers, credential
// (token file, nkey or creds), TLS files, inbox and pod, whatever their start mode;
// a service whose config differs connects on its own. The connection is made with
// the first such service's config, always in the background (bus.Config.Background),
// so that a service that must not wait for the bus (the launcher) never does; one
// that needs the bus to start waits until it is connected, as bus.Connect would
// (waitConnected). It presents the client certificate of whichever of them has one
// (bus.TLSConfig.ClientCert: a pod's sds-edge), and is drained when the last of
// them stops.
type SharedBus struct {
	mu    sync.Mutex
	conns map[busKey]*sharedConn
}

// busKey is what two services' bus configs must agree on to share a connection.
// The start mode is not part of it: a pod's launcher connects in the background
// and its sds-edge (without a gRPC CA) does not, and with the mode in the key the
// one-process pod held two connections, admitted twice.
type busKey struct {
	url, creds, nkey, token, ca, cert, key, inbox, pod string
}

func keyOf(c bus.Config) busKey {
	return busKey{url: c.URL, creds: c.CredsFile, nkey: c.NKeyFile, token: c.TokenFile, ca: c.TLS.CAFile,
		cert: c.TLS.CertFile, key: c.TLS.KeyFile, inbox: c.InboxPrefix, pod: c.Pod}
}

type sharedConn struct {
	ready chan struct{} // closed once nc or err is set
	nc    *nats.Conn
	err   error
	users int
	certs []func() (*tls.Certificate, error)
}

// clientCert is the first certificate any user of the connection has to present.
func (s *SharedBus) clientCert(sc *sharedConn) func() (*tls.Certificate, error) {
	return func() (*tls.Certificate, error) {
		s.mu.Lock()
		certs := append([]func() (*tls.Certificate, error)(nil), sc.certs...)
		s.mu.Unlock()
		for _, get := range certs {
			if c, err := get(); err == nil && c != nil {
				return c, nil
			}
		}
		return nil, nil
	}
}

// Connect returns the connection for c, making it when it is the first of its
// kind, and a release to call when the caller stops with it (the last release
// drains it). A failed first connect is every waiting caller's error, and the next
// caller tries again.
func (s *SharedBus) Connect(ctx context.Context, c bus.Config, log hclog.Logger) (*nats.Conn, func(), error) {
	k := keyOf(c)
	s.mu.Lock()
	if s.conns == nil {
		s.conns = map[busKey]*sharedConn{}
	}
	sc, found := s.conns[k]
	if !found {
		sc = &sharedConn{ready: make(chan struct{})}
		s.conns[k] = sc
	}
	sc.users++
	if c.TLS.ClientCert != nil {
		sc.certs = append(sc.certs, c.TLS.ClientCert)
	}
	s.mu.Unlock()
	if !found {
		first := c
		if first.TLS.CertFile == "" {
			first.TLS.ClientCert = s.clientCert(sc)
		}
		first.Background = true
		sc.nc, sc.err = bus.Connect(ctx, first, log)
		if sc.err != nil {
			s.mu.Lock()
			delete(s.conns, k)
			s.mu.Unlock()
		}
		close(sc.ready)
	} else {
		select {
		case <-sc.ready:
		case <-ctx.Done():
			s.release(k, sc)
			return nil, nil, ctx.Err()
		}
	}
	if sc.err != nil {
		return nil, nil, sc.err
	}
	if !c.Background {
		if err := waitConnected(ctx, sc.nc, c, log); err != nil {
			s.release(k, sc)
			return nil, nil, err
		}
	}
	var once sync.Once
	return sc.nc, func() { once.Do(func() { s.release(k, sc) }) }, nil
}

// release drops one user of sc; the last one drains the connection.
func (s *SharedBus) release(k busKey, sc *sharedConn) {
	s.mu.Lock()
	sc.users--
	last := sc.users == 0
	if last && s.conns[k] == sc {
		delete(s.conns, k)
	}
	s.mu.Unlock()
	if last && sc.nc != nil {
		bus.Drain(sc.nc)
	}
}

// waitConnected waits until nc, connecting in the background, is connected, as
// bus.Connect does for a service that needs the bus to start: at most c.ConnectWait
// (0: until ctx ends), telling c.Waiting why not yet and saying so at INFO every
// waitReport, on c.Clock.
func waitConnected(ctx context.Context, nc *nats.Conn, c bus.Config, log hclog.Logger) error {
	clk := c.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	began := clk.Now()
	reported := began
	for !nc.IsConnected() {
		why := nc.LastError()
		if why == nil {
			why = errors.New("not connected yet")
		}
		if nc.IsClosed() || c.ConnectWait > 0 && clk.Now().Sub(began) > c.ConnectWait {
			return fmt.Errorf("connect to nats at %s: %w", c.URL, why)
		}
		if c.Waiting != nil {
			c.Waiting(why)
		}
		if now := clk.Now(); now.Sub(reported) >= waitReport {
			log.Info("waiting for the bus", "url", c.URL, "waited", now.Sub(began).Round(time.Second), "error", why)
			reported = now
		}
		if !backoff.Wait(ctx, clk, waitPoll) {
			return fmt.Errorf("connect to nats at %s: %w", c.URL, ctx.Err())
		}
	}
	return nil
}

// How often waitConnected looks, and says at INFO that it still waits.
const (
	waitPoll   = 50 * time.Millisecond
	waitReport = 10 * time.Second
)
