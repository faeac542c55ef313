package auditlog_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/nats-io/nats.go/jetstream"
)

// TestScanReadsEveryMessageInOrder: across several batches of direct gets, and one by
// one on a stream that allows no direct get, skipping deleted messages and other
// subjects, stopping at upto.
func TestScanReadsEveryMessageInOrder(t *testing.T) {
	s := bustest.Server(t)
	nc := bustest.Conn(t, s)
	js := bustest.JetStream(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := auditlog.ScanBatch + 44
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprint("direct=", direct), func(t *testing.T) {
			name := fmt.Sprintf("S%v", direct)
			st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, AllowDirect: direct})
			if err != nil {
				t.Fatal(err)
			}
			for i := range n {
				subj := name + ".keep"
				if i%10 == 0 {
					subj = name + ".other"
				}
				if _, err := js.Publish(ctx, subj, []byte(fmt.Sprint(i))); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.DeleteMsg(ctx, 2); err != nil {
				t.Fatal(err)
			}
			var seqs []uint64
			err = auditlog.Scan(ctx, nc, st, name+".keep", 1, 0, func(m *jetstream.RawStreamMsg) error {
				if m.Subject != name+".keep" || m.Time.IsZero() {
					t.Fatalf("message %d: subject %s, time %v", m.Sequence, m.Subject, m.Time)
				}
				seqs = append(seqs, m.Sequence)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			want := n - (n+9)/10 - 1 // less the other subject and the deleted one
			if len(seqs) != want {
				t.Fatalf("read %d messages, want %d", len(seqs), want)
			}
			for i := 1; i < len(seqs); i++ {
				if seqs[i] <= seqs[i-1] {
					t.Fatalf("out of order at %d: %v", i, seqs[i-1:i+1])
				}
			}
			count := 0
			if err := auditlog.Scan(ctx, nc, st, name+".>", 5, 20, func(*jetstream.RawStreamMsg) error { count++; return nil }); err != nil || count != 16 {
				t.Fatalf("5 to 20: %d messages, %v", count, err)
			}
		})
	}
}
