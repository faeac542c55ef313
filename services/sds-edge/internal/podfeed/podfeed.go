// Package podfeed feeds sds-edge what the bus tells its pod: the subscriptions that
// deliver renewals, trust changes and anchors to their handlers, and a reconnect
// hook. Events go out through pkg/outbox.
package podfeed

import (
	"fmt"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/events"
)

// Handlers receive the events sds-edge acts on. Any may be nil.
type Handlers struct {
	Renew func(events.RenewDue)
	Trust func(events.TrustChanged) error
	// Federated takes a foreign trust domain's bundle (trust.federated).
	Federated func(events.TrustFederated) error
	Anchors   func(events.TrustAnchors) error
}

// Subscribe subscribes pod's renew and anchors subjects (its namespace and name:
// nothing a pod of the same name in another namespace publishes) and the trust
// subject on nc. Malformed events and events whose subject or payload names another
// pod are logged and dropped. The returned function unsubscribes.
func Subscribe(nc *nats.Conn, pod events.PodRef, h Handlers, log hclog.Logger) (func(), error) {
	renewSubj, err := events.PodRenewSubject(pod)
	if err != nil {
		return nil, err
	}
	anchorSubj, err := events.PodAnchorsSubject(pod)
	if err != nil {
		return nil, err
	}
	var subs []*nats.Subscription
	unsub := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	forThisPod := func(m *nats.Msg, ev events.TrustAnchors) error { return forPod(m.Subject, ev.Pod, pod) }
	for _, s := range []struct {
		subject string
		handle  nats.MsgHandler // nil: no handler given
	}{
		{renewSubj, renewHandler(pod, h.Renew, log)},
		{events.SubjectTrustChanged, handler("trust.changed", h.Trust, nil, log)},
		{events.TrustFederatedWildcard, handler("trust.federated", h.Federated, nil, log)},
		{anchorSubj, handler("trust anchors", h.Anchors, forThisPod, log)},
	} {
		if s.handle == nil {
			continue
		}
		sub, err := nc.Subscribe(s.subject, s.handle)
		if err != nil {
			unsub()
			return nil, fmt.Errorf("subscribe %s: %w", s.subject, err)
		}
		subs = append(subs, sub)
	}
	return unsub, nil
}

// handler decodes a T and gives it to fn once check (if any) passes, logging
// what it drops (what names the event); nil when fn is.
func handler[T events.Payload](what string, fn func(T) error, check func(*nats.Msg, T) error, log hclog.Logger) nats.MsgHandler {
	if fn == nil {
		return nil
	}
	return func(m *nats.Msg) {
		ev, _, err := events.Decode[T](m)
		if err == nil && check != nil {
			err = check(m, ev)
		}
		if err == nil {
			err = fn(ev)
		}
		if err != nil {
			log.Warn("dropping "+what+" event", "error", err)
		}
	}
}

// renewHandler gives fn the renewals for pod's default certificate, each once
// (several rotator replicas may send one renewal), and answers a renewal sent as
// a request; nil when fn is.
func renewHandler(pod events.PodRef, fn func(events.RenewDue), log hclog.Logger) nats.MsgHandler {
	if fn == nil {
		return nil
	}
	seen := newRecent(64)
	return func(m *nats.Msg) {
		ev, meta, err := events.Decode[events.RenewDue](m)
		if err == nil && !seen.add(meta.ID) {
			log.Debug("dropping repeated renew event", "id", meta.ID)
			return
		}
		if err == nil {
			err = forPod(m.Subject, ev.Pod, pod)
		}
		if err == nil && ev.Resource != "" && ev.Resource != "default" {
			err = fmt.Errorf("renew for resource %q: only default is issued here", ev.Resource)
		}
		if err != nil {
			log.Warn("dropping renew event", "error", err)
			return
		}
		log.Debug("renew due", "reason", ev.Reason, "serial", ev.Serial)
		fn(ev)
		if m.Reply != "" {
			_ = m.Respond(nil)
		}
	}
}

// forPod is nil when both the subject and the payload of an event name pod.
func forPod(subject string, payload, pod events.PodRef) error {
	if s, ok := events.PodFromSubject(subject); !ok || s != pod {
		return fmt.Errorf("event on %s, not on pod %s's subject", subject, pod)
	}
	if payload != pod {
		return fmt.Errorf("event for pod %q, not %q", payload, pod)
	}
	return nil
}

// recent remembers the last n event ids, to drop repeats (several rotator replicas
// send the same renewal with the same id).
type recent struct {
	ids  map[string]bool
	ring []string
	next int
}

func newRecent(n int) *recent { return &recent{ids: map[string]bool{}, ring: make([]string, n)} }

// add reports whether id is new, remembering it.
func (r *recent) add(id string) bool {
	if id == "" {
		return true
	}
	if r.ids[id] {
		return false
	}
	delete(r.ids, r.ring[r.next])
	r.ring[r.next] = id
	r.ids[id] = true
	r.next = (r.next + 1) % len(r.ring)
	return true
}
