package bus

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Replication is how one stream (or KV bucket: its stream, KV_<bucket>) is
// replicated, as its leader reports it (StreamInfo.Cluster): a replica that is not
// current, offline, or missing from the report (lost: its node's JetStream is
// disabled, its store full, or it was never placed) means that fewer node losses
// than the stream's replica count allows now stop its writes.
type Replication struct {
	Stream string
	Want   int    // the configured replica count
	Leader string // "" when it has none
	// Problems names each replica that is not current, one line each; empty: all
	// Want replicas current.
	Problems []string
}

// Healthy reports whether every configured replica is current under a leader.
func (r Replication) Healthy() bool { return len(r.Problems) == 0 }

// Unhealthy counts the configured replicas that are not current (all of them
// without a leader).
func (r Replication) Unhealthy() int {
	if r.Leader == "" && r.Want > 1 {
		return r.Want
	}
	return len(r.Problems)
}

func (r Replication) String() string {
	if r.Healthy() {
		return fmt.Sprintf("%s: %d/%d replicas current (leader %s)", r.Stream, r.Want, r.Want, r.Leader)
	}
	return fmt.Sprintf("%s: %d/%d replicas current: %s", r.Stream, r.Want-r.Unhealthy(), r.Want, strings.Join(r.Problems, "; "))
}

// StreamReplication asks the stream's leader how name is replicated.
func StreamReplication(ctx context.Context, js jetstream.JetStream, name string) (Replication, error) {
	st, err := js.Stream(ctx, name)
	if err != nil {
		return Replication{Stream: name}, fmt.Errorf("stream %s: %w", name, err)
	}
	return replicationOf(st.CachedInfo()), nil
}

func replicationOf(info *jetstream.StreamInfo) Replication {
	r := Replication{Stream: info.Config.Name, Want: max(1, info.Config.Replicas)}
	if info.Cluster == nil {
		if r.Want > 1 {
			r.Problems = append(r.Problems, "no cluster information (not clustered)")
		}
		return r
	}
	r.Leader = info.Cluster.Leader
	if r.Leader == "" {
		r.Problems = append(r.Problems, "no leader: writes stop")
	}
	seen := 0
	for _, p := range info.Cluster.Replicas {
		if p == nil {
			continue
		}
		seen++
		switch {
		case p.Offline:
			r.Problems = append(r.Problems, fmt.Sprintf("%s offline", p.Name))
		case !p.Current:
			r.Problems = append(r.Problems, fmt.Sprintf("%s not current (%d operations behind, seen %s ago)", p.Name, p.Lag, p.Active.Round(time.Millisecond)))
		}
	}
	if lost := r.Want - 1 - seen; lost > 0 && r.Leader != "" {
		r.Problems = append(r.Problems, fmt.Sprintf("%d replica(s) lost (not reported: JetStream disabled or the peer removed)", lost))
	}
	return r
}

// QuorumWatch polls the replication of a service's streams and buckets: a gauge
// of the replicas not current per stream (meshagent_<service>_stream_replicas_unhealthy),
// a WARN line when a stream degrades and an INFO line when it is whole again. It
// does not fail readiness: a degraded stream still serves, and a replica set that
// all fails readiness at once would stop the fleet for one lost node.
type QuorumWatch struct {
	js      jetstream.JetStream
	streams []string
	every   time.Duration
	clk     clock.Clock
	log     hclog.Logger
	gauge   *prometheus.GaugeVec

	mu   sync.Mutex
	last map[string]Replication
}

// NewQuorumWatch watches streams on js every 15 s of clk; metrics go to reg under
// meshagent_<service>_. It does nothing until Run.
func NewQuorumWatch(js jetstream.JetStream, streams []string, service string, reg prometheus.Registerer, clk clock.Clock, log hclog.Logger) (*QuorumWatch, error) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "meshagent", Subsystem: service, Name: "stream_replicas_unhealthy",
		Help: "JetStream replicas of each of the service's streams and buckets that are not current (offline, behind, lost, or every replica without a leader); -1 while it could not be asked."}, []string{"stream"})
	if err := reg.Register(g); err != nil {
		return nil, fmt.Errorf("register quorum metrics: %w", err)
	}
	return &QuorumWatch{js: js, streams: streams, every: 15 * time.Second, clk: clk, log: log, gauge: g, last: map[string]Replication{}}, nil
}

// Run checks at once and then every interval until ctx ends.
func (q *QuorumWatch) Run(ctx context.Context) error {
	t := q.clk.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
		q.Check(ctx)
		t.Reset(q.every)
	}
}

// Check asks once for every stream and updates the gauge and the log.
func (q *QuorumWatch) Check(ctx context.Context) []Replication {
	var out []Replication
	for _, name := range q.streams {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := StreamReplication(cctx, q.js, name)
		cancel()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				q.log.Debug("stream replication not known", "stream", name, "error", err)
			}
			q.gauge.WithLabelValues(name).Set(-1)
			continue
		}
		q.gauge.WithLabelValues(name).Set(float64(r.Unhealthy()))
		q.mu.Lock()
		was, known := q.last[name]
		q.last[name] = r
		q.mu.Unlock()
		switch {
		case !r.Healthy() && (!known || was.Unhealthy() != r.Unhealthy()):
			q.log.Warn("stream replication degraded: fewer node losses now stop its writes", "stream", name, "replicas", r.Want, "leader", r.Leader, "problems", r.Problems)
		case r.Healthy() && known && !was.Healthy():
			q.log.Info("stream replication whole again", "stream", name, "replicas", r.Want, "leader", r.Leader)
		}
		out = append(out, r)
	}
	return out
}

// Degraded returns the last report of every stream that is not healthy, by name.
func (q *QuorumWatch) Degraded() []Replication {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []Replication
	for _, r := range q.last {
		if !r.Healthy() {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Stream < out[j].Stream })
	return out
}
