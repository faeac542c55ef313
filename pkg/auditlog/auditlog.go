// Package auditlog reads the event history — the JetStream stream MESHAGENT_EVENTS,
// the CA's history, which is the mesh's audit log, merged by time with
// MESHAGENT_POD_EVENTS, what pods publish about themselves — the way an auditor
// needs it: from a point in time,
// filtered by pod and type, then live. It needs nothing but the audit role's rights
// (reading messages by sequence and subscribing to events): no consumer is created,
// so a reader can never disturb another role's durable. Sink writes the events it is
// given to a JSON-lines file with size-based rotation.
package auditlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Entry is one event from the history (Seq > 0) or from the live feed (Seq 0).
type Entry struct {
	Seq uint64
	// Stream is the stream Seq counts in (events.StreamEvents or StreamPodEvents).
	Stream  string
	Subject string
	Meta    events.Meta
	Payload events.Payload // nil when Err is set
	Err     error          // the event could not be decoded
}

// Pod is the pod an entry is about, "<namespace>/<name>": the one its subject
// names, else its payload's; "" for none.
func (e Entry) Pod() string {
	if p, ok := events.PodFromSubject(e.Subject); ok {
		return p.String()
	}
	switch p := e.Payload.(type) {
	case events.CertIssued:
		return p.Pod.String()
	case events.RenewDue:
		return p.Pod.String()
	}
	return ""
}

// Namespace is the namespace the entry is about: its pod's, else that of the
// SPIFFE ID it names; "" when neither.
func (e Entry) Namespace() string {
	if pod := e.Pod(); pod != "" {
		ns, _, _ := strings.Cut(pod, "/")
		return ns
	}
	if p, ok := e.Payload.(events.CertIssued); ok {
		return events.NamespaceOfID(p.SPIFFEID)
	}
	return ""
}

// Bench reports whether the entry is about meshctl bench's load (its namespace is
// events.BenchNamespace).
func (e Entry) Bench() bool { return e.Namespace() == events.BenchNamespace }

// ShortType is the event type without its namespace and version ("cert.issued").
func ShortType(t string) string {
	t = strings.TrimPrefix(t, "io.meshagent.")
	if i := strings.LastIndex(t, ".v"); i > 0 {
		t = t[:i]
	}
	return t
}

// JSON is the entry as one JSON object (one line of a JSON-lines log).
func (e Entry) JSON() ([]byte, error) {
	out := struct {
		Seq     uint64         `json:"seq,omitempty"`
		Time    time.Time      `json:"time"`
		Type    string         `json:"type"`
		Source  string         `json:"source"`
		ID      string         `json:"id"`
		Subject string         `json:"subject"`
		Pod     string         `json:"pod,omitempty"`
		Data    events.Payload `json:"data,omitempty"`
		Error   string         `json:"error,omitempty"`
	}{Seq: e.Seq, Time: e.Meta.Time.UTC(), Type: e.Meta.Type, Source: e.Meta.Source, ID: e.Meta.ID,
		Subject: e.Subject, Pod: e.Pod(), Data: e.Payload}
	if e.Err != nil {
		out.Error = e.Err.Error()
	}
	return json.Marshal(out)
}

// Filter selects entries. Zero values select everything.
type Filter struct {
	Pod   string
	Types []string // short ("cert.issued") or full type names
	Since time.Time
	// Last bounds a replay to the newest Last events stored in each stream (0: no
	// bound), however many Since would take: what a reader shows, not the history.
	Last int
}

// Match reports whether e passes the filter.
func (f Filter) Match(e Entry) bool {
	if f.Pod != "" && e.Pod() != f.Pod {
		return false
	}
	if !f.Since.IsZero() && e.Meta.Time.Before(f.Since) {
		return false
	}
	if len(f.Types) == 0 {
		return true
	}
	for _, t := range f.Types {
		if t == e.Meta.Type || t == ShortType(e.Meta.Type) {
			return true
		}
	}
	return false
}

// Log is the event history, opened for reading: the CA's stream and, when there is
// one, the pods'.
type Log struct {
	nc   *nats.Conn
	st   jetstream.Stream
	pods *Log // nil: no pods' stream (a bus from before the split)
}

// Open looks the event streams up.
func Open(ctx context.Context, nc *nats.Conn) (*Log, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return nil, fmt.Errorf("event stream %s: %w", events.StreamEvents, err)
	}
	l := &Log{nc: nc, st: st}
	ps, err := js.Stream(ctx, events.StreamPodEvents)
	switch {
	case err == nil:
		l.pods = &Log{nc: nc, st: ps}
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("event stream %s: %w", events.StreamPodEvents, err)
	}
	return l, nil
}

// Bounds describes what the stream holds now.
type Bounds struct {
	First, Last uint64
	FirstTime   time.Time
	Messages    uint64
	Bytes       uint64
	MaxAge      time.Duration
	MaxBytes    int64
	// MaxPerSubject bounds the events of one subject (the pods' stream); <= 0: none.
	MaxPerSubject int64
}

// Bounds asks the server what the stream holds.
func (l *Log) Bounds(ctx context.Context) (Bounds, error) {
	info, err := l.st.Info(ctx)
	if err != nil {
		return Bounds{}, fmt.Errorf("event stream info: %w", err)
	}
	s := info.State
	return Bounds{First: s.FirstSeq, Last: s.LastSeq, FirstTime: s.FirstTime, Messages: s.Msgs, Bytes: s.Bytes,
		MaxAge: info.Config.MaxAge, MaxBytes: info.Config.MaxBytes, MaxPerSubject: info.Config.MaxMsgsPerSubject}, nil
}

// next returns the first message at or after seq, or nil past the end.
func (l *Log) next(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	m, err := l.st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(events.EventsWildcard))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read event %d: %w", seq, err)
	}
	return m, nil
}

// SeqAt is the first sequence stored at or after t (b.Last+1 when none), found by
// bisection: a few reads, whatever the stream's size.
func (l *Log) SeqAt(ctx context.Context, b Bounds, t time.Time) (uint64, error) {
	if b.Last == 0 || b.Last < b.First || !b.FirstTime.Before(t) {
		return b.First, nil
	}
	var err error
	lo, hi := b.First, b.Last+1
	// sort.Search over [lo, hi): the first seq whose message is not before t.
	n := sort.Search(int(hi-lo), func(i int) bool {
		if err != nil {
			return true
		}
		m, e := l.next(ctx, lo+uint64(i))
		if e != nil {
			err = e
			return true
		}
		return m == nil || !m.Time.Before(t)
	})
	return lo + uint64(n), err
}

// Replay calls fn for each stored event from seq from to seq upto (inclusive) that
// passes f, in order (batched direct gets where the stream allows them: Scan).
// upto 0 is an empty stream's last sequence: nothing to replay (for Scan it would
// mean "to the end", and an event published meanwhile would be replayed as
// history, then dropped from a follow as a copy of one already seen).
func (l *Log) Replay(ctx context.Context, from, upto uint64, f Filter, fn func(Entry) error) error {
	if upto == 0 || upto < from {
		return nil
	}
	return Scan(ctx, l.nc, l.st, events.EventsWildcard, from, upto, func(m *jetstream.RawStreamMsg) error {
		e := decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}, m.Sequence)
		e.Stream = l.st.CachedInfo().Config.Name
		if e.Meta.Time.IsZero() {
			e.Meta.Time = m.Time
		}
		if !f.Match(e) {
			return nil
		}
		return fn(e)
	})
}

func decode(m *nats.Msg, seq uint64) Entry {
	return Decode(m, seq)
}

// ErrPodMismatch says that an event on a pod's subject names another pod.
var ErrPodMismatch = errors.New("the payload names another pod than its subject")

// Decode makes the entry of m (seq: its stream sequence, 0 live). A pod may
// publish only on its own subjects, so the subject says which pod an event came
// from: an event on a pod's subject whose payload names another pod (a pod.down
// forged for a victim) is not that pod's event. Its entry keeps the subject and
// carries ErrPodMismatch instead of the payload, as the rotator and the inventory
// drop it: it is printed as the publisher's, never as the victim's.
func Decode(m *nats.Msg, seq uint64) Entry {
	p, meta, err := events.DecodeAny(m)
	e := Entry{Seq: seq, Subject: m.Subject, Meta: meta, Payload: p, Err: err}
	if err != nil {
		return e
	}
	from, ok := events.PodFromSubject(m.Subject)
	if !ok {
		return e
	}
	if named, has := payloadPod(p); has && named != from {
		e.Payload, e.Err = nil, fmt.Errorf("%w: %s names %s", ErrPodMismatch, ShortType(meta.Type), named)
	}
	return e
}

// payloadPod is the pod a payload names in its Pod field, when it has one.
func payloadPod(p events.Payload) (events.PodRef, bool) {
	v := reflect.ValueOf(p)
	if v.Kind() != reflect.Struct {
		return events.PodRef{}, false
	}
	f := v.FieldByName("Pod")
	if !f.IsValid() {
		return events.PodRef{}, false
	}
	pod, ok := f.Interface().(events.PodRef)
	return pod, ok
}

// Start says where a Read begins, for the reader to tell its user: in the CA's
// history, and in the pods' events (Pods; zero without that stream).
type Start struct {
	Seq    uint64    // first sequence read
	Last   uint64    // last sequence stored when the replay began
	Oldest time.Time // the oldest event the stream still holds
	Bounds Bounds
	Pods   *Start
}

// Read replays the history from f.Since (all of it when zero) and then, if follow,
// the live events until ctx ends. started is called once, before the first entry.
// The live subscription opens before the replay, and an event seen in both is given
// once, so nothing between the two is lost or doubled.
func (l *Log) Read(ctx context.Context, f Filter, follow bool, started func(Start), fn func(Entry) error) error {
	var live chan *nats.Msg
	if follow {
		live = make(chan *nats.Msg, 4096)
		sub, err := l.nc.ChanSubscribe(events.EventsWildcard, live)
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", events.EventsWildcard, err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := l.nc.Flush(); err != nil {
			return err
		}
	}
	start, err := l.start(ctx, f.Since, f.Last)
	if err != nil {
		return err
	}
	var pstart Start
	if l.pods != nil {
		if pstart, err = l.pods.start(ctx, f.Since, f.Last); err != nil {
			return err
		}
		start.Pods = &pstart
	}
	if started != nil {
		started(start)
	}
	seen := map[string]bool{}
	err = l.replayMerged(ctx, start, pstart, func(e Entry) error {
		if follow {
			seen[e.Meta.ID] = true
		}
		if !f.Match(e) {
			return nil
		}
		return fn(e)
	})
	if err != nil || !follow {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-live:
			e := decode(m, 0)
			if e.Meta.ID != "" && seen[e.Meta.ID] {
				delete(seen, e.Meta.ID)
				continue
			}
			if f.Match(e) {
				if err := fn(e); err != nil {
					return err
				}
			}
		}
	}
}

// start is where a replay of l's stream from since (all of it when zero) begins,
// at most last events before its end (0: no bound).
func (l *Log) start(ctx context.Context, since time.Time, last int) (Start, error) {
	b, err := l.Bounds(ctx)
	if err != nil {
		return Start{}, err
	}
	from := b.First
	if last > 0 && b.Last >= uint64(last) {
		from = max(from, b.Last-uint64(last)+1)
	}
	if !since.IsZero() {
		at, err := l.SeqAt(ctx, b, since)
		if err != nil {
			return Start{}, err
		}
		from = max(from, at)
	}
	return Start{Seq: from, Last: b.Last, Oldest: b.FirstTime, Bounds: b}, nil
}

// replayMerged replays the CA's history from s and the pods' events from ps, in
// the order of their times (the CA's first on a tie): the pods' stream is read
// ahead in a goroutine, a bounded channel apart.
func (l *Log) replayMerged(ctx context.Context, s, ps Start, fn func(Entry) error) error {
	if l.pods == nil || ps.Last < ps.Seq {
		return l.Replay(ctx, s.Seq, s.Last, Filter{}, fn)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	podc := make(chan Entry, 256)
	perr := make(chan error, 1)
	go func() {
		defer close(podc)
		perr <- l.pods.Replay(ctx, ps.Seq, ps.Last, Filter{}, func(e Entry) error {
			select {
			case podc <- e:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	next, ok := <-podc
	err := l.Replay(ctx, s.Seq, s.Last, Filter{}, func(e Entry) error {
		for ok && next.Meta.Time.Before(e.Meta.Time) {
			if err := fn(next); err != nil {
				return err
			}
			next, ok = <-podc
		}
		return fn(e)
	})
	for ; err == nil && ok; next, ok = <-podc {
		err = fn(next)
	}
	if err != nil {
		return err
	}
	return <-perr
}
