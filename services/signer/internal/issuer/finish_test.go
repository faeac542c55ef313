package issuer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// slowPub stores each write after taking per of the clock.
type slowPub struct {
	clock     *clock.Fake
	per       time.Duration
	published []string
}

func (p *slowPub) Publish(msg *nats.Msg, _ time.Time, done func(error)) {
	p.clock.Add(p.per)
	p.published = append(p.published, msg.Subject)
	done(nil)
}

// TestTooLittleTimeLeftIsNotSigned: once the record and cert.issued take 400 ms to
// store, a request whose requester stops waiting in 300 ms is dropped before the
// signature (nothing stored, counted as expired, no reply) while one with 450 ms
// left is signed; and however slow the stores become, a request with more than
// maxFinishMargin left is signed (a slow stream never stops the signer).
func TestTooLittleTimeLeftIsNotSigned(t *testing.T) {
	fi := newFuzzIssuer(t)
	fi.iss.cfg.Records = testRecorder{}
	clk := clock.NewFake(fuzzNow)
	fi.iss.clk = clk
	pub := &slowPub{clock: clk, per: 200 * time.Millisecond}
	ask := func(left time.Duration) error {
		t.Helper()
		req := fi.podRequest(t)
		if left != 0 {
			req.Deadline = clk.Now().Add(left)
		}
		var got error
		fi.iss.IssueThen(context.Background(), req, Via{Transport: TransportNATS}, pub, func(_ Result, err error) { got = err })
		return got
	}
	expired := func() float64 { return testutil.ToFloat64(fi.iss.metrics.Expired.WithLabelValues(TransportNATS)) }

	if err := ask(0); err != nil { // no deadline: the first stores teach the margin
		t.Fatal(err)
	}
	if m := fi.iss.finish.margin(); m != 400*time.Millisecond {
		t.Fatalf("margin %s after one answer that took 400 ms", m)
	}
	stored := len(pub.published)
	err := ask(300 * time.Millisecond)
	var ie *Error
	if !errors.As(err, &ie) || ie.Code != events.CodeDeadlineExceeded {
		t.Fatalf("a request with 300 ms left when answers take 400 ms: %v, want deadline exceeded", err)
	}
	if len(pub.published) != stored {
		t.Fatalf("stored %v for a request dropped before its signature", pub.published[stored:])
	}
	if n := expired(); n != 1 {
		t.Fatalf("expired count %v, want 1", n)
	}
	if err := ask(450 * time.Millisecond); err != nil {
		t.Fatalf("a request with 450 ms left when answers take 400 ms: %v", err)
	}

	pub.per = 10 * time.Second // a stream election: every store slow
	for range 20 {
		if err := ask(0); err != nil {
			t.Fatal(err)
		}
	}
	if m := fi.iss.finish.margin(); m != maxFinishMargin {
		t.Fatalf("margin %s with stores of 20 s, want the cap %s", m, maxFinishMargin)
	}
	if err := ask(maxFinishMargin + 100*time.Millisecond); err != nil {
		t.Fatalf("a request with more than the cap left: %v", err)
	}
	if err := ask(maxFinishMargin - 100*time.Millisecond); err == nil {
		t.Fatal("a request with less than the cap left was signed while stores take 20 s")
	}
}
