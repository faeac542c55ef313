package faultcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Seen is one event as it crossed the bus.
type Seen struct {
	At                  time.Time
	ID, Subject, Source string
	Type                string
	Key                 string // the CloudEvents subject attribute: a serial, a pod
}

// Ledger counts events twice: as they cross the bus (a core subscription to every
// event subject, which sees a publish whether or not JetStream stores it) and as the
// event stream holds them (read back by sequence, as meshagent's admin may). Two
// different losses follow: a record the stream held and no longer holds (Recheck:
// lost by the stream), and an event seen on the bus that the stream never stored
// once the stack has healed (SettleUnstored: dropped by its publisher, which got no
// acknowledgement and did not publish it again).
type Ledger struct {
	nc *nats.Conn

	mu     sync.Mutex
	bus    []Seen
	ids    map[string]record // ce-id -> where the streams hold it
	kinds  map[string]int    // Kind(subject) -> messages in the streams
	issued map[string]bool   // serials of every cert.issued in the stream
	stored []Issued          // every cert.issued in the stream, in stream order
	next   map[string]uint64 // stream -> next sequence to read
}

// record is where an event is stored: a stream and a sequence.
type record struct {
	stream string
	seq    uint64
}

// ledgerStreams are the streams a ledger reads: the CA's history, then the pods'
// events (which may lose events by design: per-subject bounds; Recheck skips it).
var ledgerStreams = []string{events.StreamEvents, events.StreamPodEvents}

// NewLedger subscribes nc to every event subject.
func NewLedger(nc *nats.Conn) (*Ledger, error) {
	l := &Ledger{nc: nc, ids: map[string]record{}, kinds: map[string]int{}, issued: map[string]bool{}, next: map[string]uint64{}}
	if _, err := nc.Subscribe(events.EventsWildcard, func(m *nats.Msg) {
		meta, err := events.Peek(m)
		if err != nil {
			return
		}
		l.mu.Lock()
		l.bus = append(l.bus, Seen{At: time.Now(), ID: meta.ID, Subject: m.Subject, Source: meta.Source, Type: meta.Type, Key: meta.Subject})
		l.mu.Unlock()
	}); err != nil {
		return nil, err
	}
	return l, nc.Flush()
}

// Kind shortens an event subject: cert.issued, pod.sds.pushed (any pod), ...
func Kind(subject string) string {
	k := strings.TrimPrefix(subject, events.Prefix+".evt.")
	if strings.HasPrefix(k, "pod.") {
		if parts := strings.SplitN(k, ".", 3); len(parts) == 3 {
			k = "pod." + parts[2]
		}
	}
	return k
}

// Sync reads the stream from where it stopped to its last sequence, retrying in
// short attempts until within passes (the cluster may be electing a leader).
func (l *Ledger) Sync(within time.Duration) error {
	js, err := jetstream.New(l.nc)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(within)
	retry := time.NewTicker(250 * time.Millisecond)
	defer retry.Stop()
	for {
		err := l.read(js)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		<-retry.C
	}
}

func (l *Ledger) read(js jetstream.JetStream) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, name := range ledgerStreams {
		st, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) && name == events.StreamPodEvents {
			continue // a bus from before the split
		}
		if err != nil {
			return err
		}
		if err := l.readStream(ctx, st, name); err != nil {
			return err
		}
	}
	return nil
}

func (l *Ledger) readStream(ctx context.Context, st jetstream.Stream, name string) error {
	if l.next[name] == 0 {
		l.next[name] = 1
	}
	for last := st.CachedInfo().State.LastSeq; l.next[name] <= last; l.next[name]++ {
		m, err := st.GetMsg(ctx, l.next[name])
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			// A direct get is answered by any replica, and one that lags does not
			// have this sequence yet: only the leader can say it was deleted.
			var found bool
			if m, found, err = l.fromLeader(ctx, name, l.next[name]); err == nil && !found {
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("%s message %d: %w", name, l.next[name], err)
		}
		l.mu.Lock()
		l.ids[m.Header.Get(events.HeaderID)] = record{name, m.Sequence}
		l.kinds[Kind(m.Subject)]++
		if m.Subject == events.SubjectCertIssued {
			if e, _, err := events.Decode[events.CertIssued](&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}); err == nil {
				l.issued[e.Serial] = true
				l.stored = append(l.stored, Issued{At: m.Time, Serial: e.Serial, Pod: e.Pod, Signer: e.Signer, Transport: e.Transport})
			}
		}
		l.mu.Unlock()
	}
	return nil
}

// fromLeader reads message seq of stream from the stream's leader (the
// STREAM.MSG.GET API, which only the leader answers), and reports whether the
// stream holds it.
func (l *Ledger) fromLeader(ctx context.Context, stream string, seq uint64) (*jetstream.RawStreamMsg, bool, error) {
	req, _ := json.Marshal(map[string]uint64{"seq": seq})
	reply, err := l.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, false, err
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Header  []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, false, fmt.Errorf("leader's reply: %w", err)
	}
	switch {
	case resp.Error != nil && resp.Error.Code == 404:
		return nil, false, nil
	case resp.Error != nil:
		return nil, false, fmt.Errorf("leader: %d %s", resp.Error.Code, resp.Error.Description)
	case resp.Message == nil:
		return nil, false, errors.New("leader's reply without a message")
	}
	m := resp.Message
	return &jetstream.RawStreamMsg{Subject: m.Subject, Sequence: m.Seq, Header: parseHeader(m.Header), Data: m.Data, Time: m.Time}, true, nil
}

// parseHeader reads a NATS header block ("NATS/1.0", then "Key: Value" lines).
func parseHeader(b []byte) nats.Header {
	h := nats.Header{}
	lines := strings.Split(string(b), "\r\n")
	for _, line := range lines[min(1, len(lines)):] {
		if k, v, ok := strings.Cut(line, ":"); ok && k != "" {
			h.Add(k, strings.TrimSpace(v))
		}
	}
	return h
}

// Counts is a copy of the per-kind message counts of the stream read so far.
func (l *Ledger) Counts() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.kinds)
}

// SeenSince returns the events that crossed the bus from t on.
func (l *Ledger) SeenSince(t time.Time) []Seen {
	l.mu.Lock()
	defer l.mu.Unlock()
	return from(l.bus, t, func(s Seen) time.Time { return s.At })
}

// Stored reports whether the stream (as read so far) holds the event with id.
func (l *Ledger) Stored(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.ids[id]
	return ok
}

// Unstored returns the events seen on the bus since t that the stream does not
// hold as read so far.
func (l *Ledger) Unstored(since time.Time) []Seen {
	var out []Seen
	for _, s := range l.SeenSince(since) {
		if !l.Stored(s.ID) {
			out = append(out, s)
		}
	}
	return out
}

// SettleUnstored syncs and looks for events seen on the bus since t that the stream
// does not hold, until none is left or within passes: an event crosses the bus a
// moment before the stream has stored it, and a publisher retries one the stream
// refused (same id). Those excuse accepts are returned apart, as excused, and not
// waited for.
func (l *Ledger) SettleUnstored(since time.Time, within time.Duration, excuse func(Seen) bool) (lost, excused []Seen, err error) {
	deadline := time.Now().Add(within)
	retry := time.NewTicker(500 * time.Millisecond)
	defer retry.Stop()
	for {
		err = l.Sync(within)
		lost, excused = nil, nil
		for _, s := range l.Unstored(since) {
			if excuse != nil && excuse(s) {
				excused = append(excused, s)
			} else {
				lost = append(lost, s)
			}
		}
		if (err == nil && len(lost) == 0) || time.Now().After(deadline) {
			return lost, excused, err
		}
		<-retry.C
	}
}

// ByKind counts events by Kind of their subject.
func ByKind(seen []Seen) map[string]int {
	out := map[string]int{}
	for _, s := range seen {
		out[Kind(s.Subject)]++
	}
	return out
}

// Recheck reads again every record of the CA's history read so far and reports
// the first that the stream no longer holds, or holds with another event id: a
// record lost by the stream (JetStream's own durability, checked after each
// fault). The pods' stream is not rechecked: its per-subject bound drops events.
func (l *Ledger) Recheck() error {
	js, err := jetstream.New(l.nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return err
	}
	l.mu.Lock()
	want := make(map[uint64]string, len(l.ids))
	for id, r := range l.ids {
		if r.stream == events.StreamEvents {
			want[r.seq] = id
		}
	}
	l.mu.Unlock()
	for _, seq := range slices.Sorted(maps.Keys(want)) {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			return fmt.Errorf("record %d (event %s): %w", seq, want[seq], err)
		}
		if id := m.Header.Get(events.HeaderID); id != want[seq] {
			return fmt.Errorf("record %d: event %s, was %s", seq, id, want[seq])
		}
	}
	return nil
}

// Issued is one cert.issued as the stream holds it.
type Issued struct {
	At        time.Time // when the stream stored it
	Serial    string
	Pod       events.PodRef
	Signer    string
	Transport string
}

// IssuedSince returns every cert.issued for pod the stream (as read so far) stored
// from t on: a stored event, unlike one seen on the bus, is counted even when the
// ledger's own connection was cut off as it crossed.
func (l *Ledger) IssuedSince(t time.Time, pod events.PodRef) []Issued {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Issued
	for _, i := range l.stored {
		if i.Pod == pod && !i.At.Before(t) {
			out = append(out, i)
		}
	}
	return out
}

// HasIssued reports whether the stream holds a cert.issued for serial.
func (l *Ledger) HasIssued(serial string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.issued[serial]
}

// Diff formats after-before per kind: "cert.issued +3, pod.sds.pushed +5".
func Diff(before, after map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if d := after[k] - before[k]; d != 0 {
			parts = append(parts, fmt.Sprintf("%s +%d", k, d))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
