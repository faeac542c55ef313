package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go/jetstream"
)

// Default retention of the CA's history (the audit log): seven days, at most 1 GiB
// (the oldest events go first). Only the signer and the rotator publish into it.
const (
	DefaultEventStreamMaxAge   = 7 * 24 * time.Hour
	DefaultEventStreamMaxBytes = int64(1) << 30
)

// Default bounds of the pods' events (events.StreamPodEvents). A pod may publish on
// its own subjects only; these keep what one pod publishes from costing more than
// its share: a pod's flood replaces that pod's older events of the same kind
// (per subject), never the CA's history, which is another stream.
const (
	DefaultPodEventsMaxAge            = 24 * time.Hour
	DefaultPodEventsMaxBytes          = int64(256) << 20
	DefaultPodEventsMaxMsgsPerSubject = 64
	// DefaultPodEventsMaxMsgSize is the largest pod event the stream stores, its
	// headers included: the readers' limit (events.MaxEventSize), so that nothing
	// is stored that every reader refuses.
	DefaultPodEventsMaxMsgSize = events.MaxEventSize
)

// Retention bounds the event history. Zero values take the defaults; MaxBytes < 0
// removes the size bound of the CA's history.
type Retention struct {
	MaxAge   time.Duration
	MaxBytes int64
	// Pods bounds the pods' events.
	Pods PodEventLimits
}

// PodEventLimits bound the pods' event stream. Zero values take the defaults
// (DefaultPodEvents*); none can be removed.
type PodEventLimits struct {
	MaxAge            time.Duration
	MaxBytes          int64
	MaxMsgsPerSubject int64
	MaxMsgSize        int32
}

// WithDefaults fills the zero (or negative) bounds with the defaults.
func (l PodEventLimits) WithDefaults() PodEventLimits {
	if l.MaxAge <= 0 {
		l.MaxAge = DefaultPodEventsMaxAge
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultPodEventsMaxBytes
	}
	if l.MaxMsgsPerSubject <= 0 {
		l.MaxMsgsPerSubject = DefaultPodEventsMaxMsgsPerSubject
	}
	if l.MaxMsgSize <= 0 {
		l.MaxMsgSize = DefaultPodEventsMaxMsgSize
	}
	return l
}

// EnsureEventStream creates or updates the JetStream streams that keep the events:
// the CA's history (events.StreamEvents over events.CAEventSubjects) and the pods'
// events (events.StreamPodEvents over events.PodEventsWildcard, with the default
// PodEventLimits). replicas is 1 on an embedded server, 3 on a fleet's cluster;
// maxAge bounds the CA's history. Its size bound is the one the stream already has
// (an operator may set it with the nats CLI), else DefaultEventStreamMaxBytes.
func EnsureEventStream(ctx context.Context, js jetstream.JetStream, replicas int, maxAge time.Duration) (jetstream.Stream, error) {
	r := Retention{MaxAge: maxAge}
	if st, err := js.Stream(ctx, events.StreamEvents); err == nil && st.CachedInfo() != nil {
		r.MaxBytes = st.CachedInfo().Config.MaxBytes
	}
	return EnsureEventStreamRetention(ctx, js, replicas, r)
}

// EnsureEventStreamRetention is EnsureEventStream with every bound given. It returns
// the CA's history stream.
//
// A CA history stream made before the split captured meshagent.evt.> whole: it is
// narrowed first (the pods' events it already holds stay until they age out), since
// two streams may not capture one subject.
func EnsureEventStreamRetention(ctx context.Context, js jetstream.JetStream, replicas int, r Retention) (jetstream.Stream, error) {
	if replicas <= 0 {
		replicas = 1
	}
	if r.MaxAge <= 0 {
		r.MaxAge = DefaultEventStreamMaxAge
	}
	switch {
	case r.MaxBytes == 0:
		r.MaxBytes = DefaultEventStreamMaxBytes
	case r.MaxBytes < 0:
		r.MaxBytes = -1
	}
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        events.StreamEvents,
		Description: "meshagent CA history: certificates issued, trust changes, rotations",
		Subjects:    events.CAEventSubjects,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		MaxAge:      r.MaxAge,
		MaxBytes:    r.MaxBytes,
		Discard:     jetstream.DiscardOld,
		// Readers (audit) read by sequence, in batches: direct gets, no consumer.
		AllowDirect: true,
		MaxMsgSize:  events.MaxEventSize + 4096,
		Duplicates:  2 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", events.StreamEvents, err)
	}
	if _, err := EnsurePodEventStream(ctx, js, replicas, r.Pods); err != nil {
		return nil, err
	}
	return st, nil
}

// EnsurePodEventStream creates or updates the pods' event stream with limits l
// (zero values: the defaults). Old events go first; a subject (one pod, one kind)
// keeps at most l.MaxMsgsPerSubject events.
func EnsurePodEventStream(ctx context.Context, js jetstream.JetStream, replicas int, l PodEventLimits) (jetstream.Stream, error) {
	if replicas <= 0 {
		replicas = 1
	}
	l = l.WithDefaults()
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:              events.StreamPodEvents,
		Description:       "meshagent pods' events (up, down, sds, xds, envoy), bounded per pod and kind",
		Subjects:          []string{events.PodEventsWildcard},
		Storage:           jetstream.FileStorage,
		Replicas:          replicas,
		MaxAge:            l.MaxAge,
		MaxBytes:          l.MaxBytes,
		MaxMsgsPerSubject: l.MaxMsgsPerSubject,
		MaxMsgSize:        l.MaxMsgSize,
		Discard:           jetstream.DiscardOld,
		AllowDirect:       true,
		Duplicates:        2 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", events.StreamPodEvents, err)
	}
	return st, nil
}
