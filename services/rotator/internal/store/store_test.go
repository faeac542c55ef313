package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/rotator/internal/schedule"
	"github.com/meshagent/meshagent/tests/bustest"
)

func open(t *testing.T) *Store {
	t.Helper()
	s := bustest.Server(t)
	js := bustest.JetStream(t, bustest.Conn(t, s))
	st, err := Open(context.Background(), js, "test_sched", 1, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func rec(pod, res, serial string) schedule.Record {
	nb := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	return schedule.Record{Pod: pod, Resource: res, Serial: serial, Root: "r", NotBefore: nb.UnixNano(), NotAfter: nb.Add(time.Hour).UnixNano()}
}

func TestWriteIsCompareAndSet(t *testing.T) {
	ctx := context.Background()
	st := open(t)
	r := rec("web-0.ns", "file-cert:/etc/certs/a.pem", "1")
	rev, err := st.Write(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write(ctx, r); !errors.Is(err, ErrConflict) {
		t.Fatalf("second create: %v, want ErrConflict", err)
	}
	r.Serial, r.Rev = "2", rev
	rev2, err := st.Write(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	r.Serial = "3" // still at rev, now stale
	if _, err := st.Write(ctx, r); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale update: %v, want ErrConflict", err)
	}
	got, ok, err := st.Get(ctx, "web-0.ns", "file-cert:/etc/certs/a.pem")
	if err != nil || !ok || got.Serial != "2" || got.Rev != rev2 {
		t.Fatalf("get: %+v %v %v", got, ok, err)
	}
	if err := st.Delete(ctx, r.Pod, r.Resource, rev); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale delete: %v", err)
	}
	if err := st.Delete(ctx, r.Pod, r.Resource, rev2); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := st.Get(ctx, r.Pod, r.Resource); ok {
		t.Fatal("deleted entry still there")
	}
}

func TestLoadAndCatchUp(t *testing.T) {
	ctx := context.Background()
	st := open(t)
	now := clock.NewFake(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
	cfg := schedule.Config{GraceRatio: 0.5, RetryAfter: time.Minute, RetryMax: time.Hour}

	empty := schedule.New(cfg)
	if n, seq, err := st.Load(ctx, empty, now); err != nil || n != 0 || seq != 0 {
		t.Fatalf("empty bucket: %d %d %v", n, seq, err)
	}
	for _, p := range []string{"a", "b", "c"} {
		if _, err := st.Write(ctx, rec(p, "default", "1")); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.PutTrust(ctx, schedule.Trust{Current: "r2", Old: []string{"r"}, Generation: 2}); err != nil {
		t.Fatal(err)
	}
	s := schedule.New(cfg)
	_, seq, err := st.Load(ctx, s, now)
	if err != nil || s.Len() != 3 || s.Trust().Current != "r2" {
		t.Fatalf("load: %d entries, trust %+v, %v", s.Len(), s.Trust(), err)
	}
	// Changes after seq: one delete, one new entry; catching up applies just those.
	if err := st.Delete(ctx, "a", "default", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write(ctx, rec("d", "default", "1")); err != nil {
		t.Fatal(err)
	}
	n, _, err := st.CatchUp(ctx, seq, s, now)
	if err != nil || n != 2 || s.Len() != 3 {
		t.Fatalf("catch up: read %d, %d entries, %v", n, s.Len(), err)
	}
	if _, ok := s.Record("a", "default"); ok {
		t.Fatal("deleted entry survived the catch-up")
	}
	if r, ok := s.Record("d", "default"); !ok || r.Rev == 0 {
		t.Fatalf("new entry: %+v", r)
	}
}

// TestLongKeysAreRefused: a key over MaxKeyLen would overflow the NATS control
// line and close the connection, so it is refused before anything is sent, the
// connection stays usable, and the longest valid pod and resource still fit.
func TestLongKeysAreRefused(t *testing.T) {
	ctx := context.Background()
	st := open(t)
	long := strings.Repeat("a", 3000)
	max253 := strings.Repeat("b", 253)
	tests := []struct {
		name     string
		pod, res string
		tooLong  bool
	}{
		{"long resource", "web-0", long, true},
		{"long pod", long, "default", true},
		{"just over the bound", "p", strings.Repeat("c", (MaxKeyLen-len("e.")-2-1)*3/4+1), true},
		{"longest valid pod and resource", max253, max253, false},
		{"default resource", "web-0", "", false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k, err := Key(tc.pod, tc.res)
			if tc.tooLong {
				if !errors.Is(err, ErrKeyTooLong) || k != "" {
					t.Fatalf("Key: %q, %v; want ErrKeyTooLong", k, err)
				}
				r := rec(tc.pod, tc.res, "1")
				if _, err := st.Write(ctx, r); !errors.Is(err, ErrKeyTooLong) {
					t.Fatalf("Write: %v, want ErrKeyTooLong", err)
				}
				if _, _, err := st.Get(ctx, tc.pod, tc.res); !errors.Is(err, ErrKeyTooLong) {
					t.Fatalf("Get: %v, want ErrKeyTooLong", err)
				}
				if err := st.Delete(ctx, tc.pod, tc.res, 0); !errors.Is(err, ErrKeyTooLong) {
					t.Fatalf("Delete: %v, want ErrKeyTooLong", err)
				}
				return
			}
			if err != nil || len(k) > MaxKeyLen {
				t.Fatalf("Key: %d bytes, %v", len(k), err)
			}
			// The connection survived the refused writes: a valid key round-trips.
			r := rec(tc.pod, tc.res, fmt.Sprint(i))
			if _, err := st.Write(ctx, r); err != nil {
				t.Fatal(err)
			}
			got, ok, err := st.Get(ctx, tc.pod, tc.res)
			if err != nil || !ok || got.Serial != r.Serial {
				t.Fatalf("get: %+v %v %v", got, ok, err)
			}
		})
	}
}
