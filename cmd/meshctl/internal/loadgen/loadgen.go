// Package loadgen is meshctl's load generators: `bench sign` (prepared CSRs sent
// by in-flight requesters on a sign subject, the latencies and the signer's CPU
// per CSR measured) and `bench storm` (a fleet of simulated pods starting at once,
// each connecting to the bus — to the hub, or through the node agents the storm
// starts — and asking for its certificate, in worker processes past one
// process's open files, and optionally a root rotation followed through them). A run is a config in and a result out (Sign,
// Storm); the commands in cli parse the flags into the config and print the
// result.
package loadgen

import (
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

func closeAll(conns []*nats.Conn) {
	for _, nc := range conns {
		nc.Close()
	}
}

// latest is the latest of the times marked, safe for concurrent use.
type latest struct {
	mu sync.Mutex
	t  time.Time
	// all are the times marked, in Unix milliseconds (for the storm's quantiles).
	all []int64
}

// mark records now.
func (l *latest) mark() {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if now.After(l.t) {
		l.t = now
	}
	l.all = append(l.all, now.UnixMilli())
}

// times are the times marked, in Unix milliseconds.
func (l *latest) times() []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.all)
}

// since is the time from start to the latest time marked (0: none).
func (l *latest) since(start time.Time) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.t.IsZero() {
		return 0
	}
	return l.t.Sub(start).Seconds()
}

// at is the latest time marked (zero: none).
func (l *latest) at() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.t
}
