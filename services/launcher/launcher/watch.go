package launcher

import (
	"context"

	"github.com/meshagent/meshagent/pkg/events"
)

// watchParts checks, every WatchEvery until ctx ends, that the pod's other parts
// still serve — sds-edge's socket with its certificate and trust bundle, the relay
// with its upstream — as the gate did before Envoy started. The answer feeds
// readiness at once (the gate's Recent), and each change between serving and not
// is logged and published as pod.parts: a crashed or frozen sds-edge shows in
// the pod's readiness and events, not only in Envoy's failing handshakes.
func (l *Launcher) watchParts(ctx context.Context) {
	t := l.clock.NewTimer(l.cfg.WatchEvery)
	defer t.Stop()
	var was []string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			t.Reset(l.cfg.WatchEvery)
		}
		missing := l.gate.Refresh(ctx)
		if ctx.Err() != nil {
			return
		}
		if (len(missing) == 0) == (len(was) == 0) {
			continue // published on a change between serving and not only: no flood of rewordings
		}
		if len(missing) > 0 {
			l.log.Warn("a part of the pod stopped serving: not ready", "missing", missing)
		} else {
			l.log.Info("the pod's parts serve again", "were_missing", was)
		}
		was = missing
		l.publishParts(missing)
	}
}

func (l *Launcher) publishParts(missing []string) {
	if l.pub == nil {
		return
	}
	subj, err := events.PodEventSubject(l.cfg.PodRef(), events.PodEventParts)
	if err != nil {
		l.log.Error("event subject", "error", err)
		return
	}
	if len(missing) > 16 {
		missing = missing[:16]
	}
	l.pub.Publish(subj, events.PodParts{Pod: l.cfg.PodRef(), Healthy: len(missing) == 0, Missing: missing})
}
