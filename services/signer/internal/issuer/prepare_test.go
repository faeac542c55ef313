package issuer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// lifeCounter counts the leaf lifetimes noted before the mesh CA signs.
type lifeCounter struct{ n int }

func (l *lifeCounter) NoteLife(context.Context, time.Duration) error { l.n++; return nil }

// throughProve runs req through the stages before policy, which must pass it.
func (fi *fuzzIssuer) throughProve(t *testing.T, req events.SignRequest) *request {
	t.Helper()
	r := &request{req: req, via: Via{Transport: TransportNATS}}
	for _, stage := range []func(*request) error{
		fi.iss.check,
		func(r *request) error { return fi.iss.authenticateCaller(context.Background(), r) },
		fi.iss.prove,
	} {
		if err := stage(r); err != nil {
			t.Fatalf("refused before the policy stage: %v", err)
		}
	}
	return r
}

// The check stage refuses what breaks the limits before anyone is authenticated.
func TestCheckStageRefusesWithAReason(t *testing.T) {
	fi := newFuzzIssuer(t)
	good := fi.podRequest(t)
	tests := []struct {
		name   string
		mutate func(*events.SignRequest)
		code   string
	}{
		{"ttl above the max", func(r *events.SignRequest) { r.TTL = maxTTL + time.Hour }, events.CodeInvalidArgument},
		{"unknown signer", func(r *events.SignRequest) { r.CertSigner = "example.com/other" }, events.CodeInvalidArgument},
		{"other resource", func(r *events.SignRequest) { r.Resource = "ROOTCA" }, events.CodeInvalidArgument},
		{"not a CSR", func(r *events.SignRequest) { r.CSR = "nope" }, events.CodeInvalidArgument},
		{"expired", func(r *events.SignRequest) { r.Deadline = fuzzNow.Add(-time.Second) }, events.CodeDeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := good
			tt.mutate(&req)
			err := fi.iss.check(&request{req: req, via: Via{Transport: TransportNATS}})
			var e *Error
			if !errors.As(err, &e) || e.Code != tt.code {
				t.Fatalf("check = %v, want code %s", err, tt.code)
			}
		})
	}
	if err := fi.iss.check(&request{req: good, via: Via{Transport: TransportNATS}}); err != nil {
		t.Fatalf("a good request refused: %v", err)
	}
}

// The prove stage records a certificate only for a pod its credentials prove.
func TestProveStageRefusesAnUnprovedPod(t *testing.T) {
	fi := newFuzzIssuer(t)
	r := fi.throughProve(t, fi.podRequest(t))
	if r.pod.Name != tokenPod || r.holder != r.pod.String() {
		t.Fatalf("proved pod %q, holder %q", r.pod, r.holder)
	}
	r.req.Pod.Name = "another-pod"
	var e *Error
	if err := fi.iss.prove(r); !errors.As(err, &e) || e.Code != events.CodePermissionDenied {
		t.Fatalf("prove = %v, want permission denied", err)
	}
}

// A request the policy stage refuses changes nothing: nothing is signed, noted,
// counted as issued, remembered as an answer or written.
func TestPolicyStageRefusalChangesNothing(t *testing.T) {
	tests := []struct {
		name string
		set  func(fi *fuzzIssuer, r *request)
		code string
	}{
		{"holder keeps asking", func(fi *fuzzIssuer, r *request) {
			fi.iss.again.limit = 1
			fi.iss.again.issued(r.holder, fuzzNow.Add(-2*time.Second), time.Hour)
			fi.iss.again.issued(r.holder, fuzzNow.Add(-time.Second), time.Hour) // early
		}, events.CodeResourceExhausted},
		{"too little time left to answer", func(fi *fuzzIssuer, r *request) {
			fi.iss.finish.observe(time.Second)
			r.req.Deadline = fuzzNow.Add(time.Millisecond)
		}, events.CodeDeadlineExceeded},
		{"expired", func(_ *fuzzIssuer, r *request) { r.req.Deadline = fuzzNow }, events.CodeDeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fi := newFuzzIssuer(t)
			lives := &lifeCounter{}
			fi.iss.cfg.Lives, fi.iss.cfg.Records = lives, testRecorder{}
			r := fi.throughProve(t, fi.podRequest(t))
			tt.set(fi, r)
			early := len(fi.iss.again.seen[r.holder])
			repeat, err := fi.iss.policy(context.Background(), r)
			var e *Error
			if repeat != nil || !errors.As(err, &e) || e.Code != tt.code {
				t.Fatalf("policy = %v, %v; want refused with %s", repeat, err, tt.code)
			}
			issued := testutil.ToFloat64(fi.iss.metrics.Issued.WithLabelValues(TransportNATS))
			if lives.n != 0 || issued != 0 || len(fi.published) != 0 || len(fi.iss.answers.by) != 0 || len(fi.iss.again.seen[r.holder]) != early {
				t.Fatalf("a refused request left a trace: %d lives noted, %v issued, %d written, %d answers, %d issues kept (had %d)",
					lives.n, issued, len(fi.published), len(fi.iss.answers.by), len(fi.iss.again.seen[r.holder]), early)
			}
		})
	}
}

// Past the policy stage the request is signed and its writes made, in order: a
// pod's record, then cert.issued.
func TestSignAndRecordStages(t *testing.T) {
	fi := newFuzzIssuer(t)
	lives := &lifeCounter{}
	fi.iss.cfg.Lives, fi.iss.cfg.Records = lives, testRecorder{}
	r := fi.throughProve(t, fi.podRequest(t))
	if repeat, err := fi.iss.policy(context.Background(), r); repeat != nil || err != nil {
		t.Fatalf("policy = %v, %v", repeat, err)
	}
	leaf, err := fi.iss.sign(context.Background(), r)
	if err != nil || lives.n != 1 {
		t.Fatalf("sign = %v (%d lives noted)", err, lives.n)
	}
	is, err := fi.iss.record(r, leaf)
	if err != nil {
		t.Fatal(err)
	}
	if len(is.msgs) != 2 || is.msgs[0].Subject != recordSubject || is.msgs[1].Subject != events.SubjectCertIssued || is.ev.Pod != r.pod {
		t.Fatalf("writes %d (%v), event %+v", len(is.msgs), is.msgs, is.ev)
	}
}
