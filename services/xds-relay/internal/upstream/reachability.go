package upstream

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// ConnectedMetric names the gauge that is 1 while the upstream connection is READY.
const ConnectedMetric = "meshagent_xds_relay_upstream_connected"

// Reachability keeps the Dialer's shared connection connecting, with or without
// a relayed stream on it, and reports whether the discovery server is reachable
// with the relay's credentials (the connection READY: TCP, TLS and HTTP/2 done).
// Reconnection and its backoff are gRPC's; when the Dialer retires the connection
// (a TLS rebuild) the watch moves to the new one.
type Reachability struct {
	d     *Dialer
	log   hclog.Logger
	gauge prometheus.Gauge
	clock clock.Clock
	retry time.Duration // between attempts when no connection can be built

	mu        sync.Mutex
	state     string // gRPC's connectivity state, or why there is no connection
	connected bool
	once      bool // connected at least once since start
}

// NewReachability registers the gauge on reg; nothing runs until Run. clk times
// the retries while no connection can be built (gRPC times its own).
func NewReachability(d *Dialer, reg prometheus.Registerer, clk clock.Clock, log hclog.Logger) (*Reachability, error) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: ConnectedMetric,
		Help: "1 while the connection to the discovery server is established (TLS and HTTP/2 included), else 0."})
	if err := reg.Register(g); err != nil {
		return nil, fmt.Errorf("register %s: %w", ConnectedMetric, err)
	}
	return &Reachability{d: d, log: log, gauge: g, clock: clk, retry: time.Second, state: "not dialled"}, nil
}

// Connected says whether the upstream connection is READY now.
func (r *Reachability) Connected() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.connected
}

// Ready is the relay's readiness check "upstream": an error naming the address
// and the connection's state until the upstream has been reached once. It then
// stays nil when the connection is lost, as pilot-agent's readiness does once
// Envoy had its config (docs/architecture.md, xds-relay): a control-plane outage
// must not take the pod out of its Services; Connected and the gauge say "now".
func (r *Reachability) Ready() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.once {
		return nil
	}
	return fmt.Errorf("%s not reachable (%s)", r.d.Address(), r.state)
}

// Run watches the shared connection until ctx ends; it returns nil then.
func (r *Reachability) Run(ctx context.Context) error {
	defer r.set(false, "stopped", false)
	for ctx.Err() == nil {
		cc, gone, release, err := r.d.Shared()
		if err != nil {
			// No TLS configuration yet (sds-edge has no certificate or roots):
			// nothing gRPC can retry; try again shortly.
			r.set(false, err.Error(), true)
			t := r.clock.NewTimer(r.retry)
			select {
			case <-ctx.Done():
			case <-t.C():
			}
			t.Stop()
			continue
		}
		r.watch(ctx, cc, gone)
		release()
	}
	return nil
}

// watch follows one connection's states until ctx ends or the Dialer retires it.
func (r *Reachability) watch(ctx context.Context, cc *grpc.ClientConn, gone <-chan struct{}) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-gone:
			cancel()
		case <-wctx.Done():
		}
	}()
	fresh := true // a new connection's IDLE/CONNECTING do not mean the old one was lost
	for {
		s := cc.GetState()
		switch s {
		case connectivity.Ready:
			fresh = false
			r.set(true, s.String(), true)
		case connectivity.Idle:
			cc.Connect() // pick_first goes IDLE when a READY connection drops
			if !fresh {
				r.set(false, s.String(), true)
			} else {
				r.set(r.Connected(), s.String(), true)
			}
		case connectivity.Connecting:
			r.set(r.Connected() && fresh, s.String(), true)
		default: // TRANSIENT_FAILURE, SHUTDOWN
			fresh = false
			r.set(false, s.String(), true)
		}
		if !cc.WaitForStateChange(wctx, s) {
			return
		}
	}
}

// set records the state and logs each change of reachability at INFO.
func (r *Reachability) set(connected bool, state string, logIt bool) {
	r.mu.Lock()
	changed := connected != r.connected
	r.connected, r.state = connected, state
	if connected {
		r.once = true
	}
	r.mu.Unlock()
	if connected {
		r.gauge.Set(1)
	} else {
		r.gauge.Set(0)
	}
	if !changed || !logIt {
		return
	}
	if connected {
		r.log.Info("upstream connected", "address", r.d.Address())
	} else {
		r.log.Info("upstream lost", "address", r.d.Address(), "state", state)
	}
}
