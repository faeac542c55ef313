package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/rotator/internal/schedule"
	"github.com/nats-io/nats.go/jetstream"
)

// Update is one change read back from the bucket, in bucket order.
type Update struct {
	Seq    uint64           // the bucket stream's sequence of this change
	Trust  *schedule.Trust  // the trust view changed
	Record *schedule.Record // an entry was written
	// Deleted names an entry that was removed (Record and Trust are nil).
	Pod, Resource string
}

// Apply makes the change to s.
func (u Update) Apply(s *schedule.Schedule, now time.Time) {
	switch {
	case u.Trust != nil:
		s.RestoreTrust(*u.Trust, now)
	case u.Record != nil:
		_ = s.Replace(*u.Record, now)
	case u.Pod != "":
		s.Remove(u.Pod, u.Resource)
	}
}

// Follow reads every change to the bucket after sequence from, in order, calling
// each for it, and caughtUp once when it has read everything written so far. It
// runs until ctx is done (returning nil) or the bus fails. A rotator replays the
// whole bucket (from 0) to rebuild its schedule; a follower keeps following to
// stay warm, and the leader it becomes reads only what it missed.
//
// It reads the bucket's stream with a pull-based ordered consumer: several times
// faster than a KV watch (push, flow-controlled) at 10^5-10^6 keys.
func (s *Store) Follow(ctx context.Context, from uint64, each func(Update), caughtUp func()) error {
	prefix := "$KV." + s.bucket + "."
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{prefix + ">"}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from+1
	}
	cons, err := s.js.OrderedConsumer(ctx, "KV_"+s.bucket, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("follow bucket: %w", err)
	}
	pending := true
	if info := cons.CachedInfo(); info != nil && info.NumPending == 0 {
		pending = false
		caughtUp()
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(4096))
	if err != nil {
		return fmt.Errorf("follow bucket: %w", err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("follow bucket: %w", err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("follow bucket: %w", err)
		}
		if u, err := s.parse(strings.TrimPrefix(msg.Subject(), prefix), msg.Headers().Get("KV-Operation"), msg.Data(), md.Sequence.Stream); err != nil {
			s.log.Warn("skipping undecodable bucket entry", "subject", msg.Subject(), "error", err)
		} else {
			each(u)
		}
		if pending && md.NumPending == 0 {
			pending = false
			caughtUp()
		}
	}
}

func (s *Store) parse(key, op string, data []byte, seq uint64) (Update, error) {
	u := Update{Seq: seq}
	if key == trustKey {
		if op != "" {
			return u, nil // trust view removed: nothing to apply
		}
		var t schedule.Trust
		if err := json.Unmarshal(data, &t); err != nil {
			return u, fmt.Errorf("decode trust: %w", err)
		}
		u.Trust = &t
		return u, nil
	}
	if !strings.HasPrefix(key, entryPrefix) {
		return u, nil
	}
	if op != "" { // DEL or PURGE
		pod, res, err := splitKey(key)
		u.Pod, u.Resource = pod, res
		return u, err
	}
	r, err := decodeRaw(key, data, seq)
	if err != nil {
		return u, err
	}
	u.Record = &r
	return u, nil
}

func splitKey(key string) (string, string, error) {
	p, r, ok := strings.Cut(strings.TrimPrefix(key, entryPrefix), ".")
	pod, err1 := base64.RawURLEncoding.DecodeString(p)
	res, err2 := base64.RawURLEncoding.DecodeString(r)
	if !ok || err1 != nil || err2 != nil || len(pod) == 0 {
		return "", "", fmt.Errorf("bad key %q", key)
	}
	return string(pod), string(res), nil
}

// Load replays the whole bucket into s and returns the number of changes applied
// and the last sequence read.
func (s *Store) Load(ctx context.Context, sched *schedule.Schedule, clk clock.Clock) (n int, seq uint64, err error) {
	return s.CatchUp(ctx, 0, sched, clk)
}

// CatchUp applies every change after sequence from to sched, up to what the bucket
// holds now (each applied at clk's time), and returns how many it applied and the
// last sequence read.
func (s *Store) CatchUp(ctx context.Context, from uint64, sched *schedule.Schedule, clk clock.Clock) (n int, seq uint64, err error) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	seq = from
	done := false
	err = s.Follow(lctx, from, func(u Update) {
		u.Apply(sched, clk.Now())
		seq = u.Seq
		n++
	}, func() { done = true; cancel() })
	if err == nil && !done {
		err = fmt.Errorf("load bucket: %w", ctx.Err())
	}
	return n, seq, err
}
