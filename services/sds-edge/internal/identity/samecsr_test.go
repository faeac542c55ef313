package identity

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/sds-edge/internal/caclient"
)

// timingOut is a signer whose every answer is lost: each request times out. It
// keeps the CSRs it was sent.
type timingOut struct {
	mu   sync.Mutex
	csrs []string
	// waits are how long each request was given; refuse answers with a refusal
	// instead of timing out.
	waits  []time.Duration
	refuse bool
}

func (s *timingOut) Sign(ctx context.Context, req events.SignRequest) (caclient.Response, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.csrs = append(s.csrs, req.CSR)
	d, _ := ctx.Deadline()
	s.waits = append(s.waits, time.Until(d).Round(100*time.Millisecond))
	if s.refuse {
		return caclient.Response{}, &events.ReplyError{Code: events.CodeInternal, Message: "refused"}
	}
	return caclient.Response{}, context.DeadlineExceeded
}

// TestUnansweredAttemptsWaitLonger: attempts the signer left unanswered in a row
// are each given twice the last one's time (CA_TIMEOUT, then 2x, 4x), so that a
// signer slower than CA_TIMEOUT is waited for instead of asked again and again;
// attempts refused are each given CA_TIMEOUT (the control).
func TestUnansweredAttemptsWaitLonger(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("a-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, refuse := range []bool{false, true} {
		signer := &timingOut{refuse: refuse}
		m := New(Config{SPIFFEID: "spiffe://cluster.local/ns/shop/sa/web", TokenFile: tokenFile, KeyAlg: pki.ECP256,
			RequestTimeout: time.Second, RetryMin: time.Millisecond, RetryMax: 2 * time.Millisecond},
			signer, nil, &nopObserver{}, clock.Real{}, hclog.NewNullLogger())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- m.issue(ctx, "test") }()
		deadline := time.Now().Add(30 * time.Second)
		for len(signer.sent()) < 3 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		cancel()
		<-done
		signer.mu.Lock()
		waits := signer.waits[:3]
		signer.mu.Unlock()
		want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}
		if refuse {
			want = []time.Duration{time.Second, time.Second, time.Second}
		}
		for i := range want {
			if waits[i] != want[i] {
				t.Fatalf("refused=%t: attempts given %v, want %v", refuse, waits, want)
			}
		}
	}
}

func (s *timingOut) sent() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.csrs...)
}

// TestARenewalAsksWithOneCSR: every attempt of one renewal sends the same CSR, so
// that a signer whose answer was lost (the attempt timed out as it answered)
// answers the next attempt with the certificate it recorded for that CSR instead of
// signing another; the next renewal has a new key.
func TestARenewalAsksWithOneCSR(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("a-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	signer := &timingOut{}
	m := New(Config{SPIFFEID: "spiffe://cluster.local/ns/shop/sa/web", TokenFile: tokenFile, KeyAlg: pki.ECP256,
		RequestTimeout: time.Second, RetryMin: time.Millisecond, RetryMax: 2 * time.Millisecond},
		signer, nil, &nopObserver{}, clock.Real{}, hclog.NewNullLogger())
	renew := func(attempts int) []string {
		t.Helper()
		before := len(signer.sent())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- m.issue(ctx, "test") }()
		deadline := time.Now().Add(30 * time.Second)
		for len(signer.sent()) < before+attempts {
			if time.Now().After(deadline) {
				t.Fatalf("%d attempts in 30 s, want %d", len(signer.sent())-before, attempts)
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		if err := <-done; err != context.Canceled {
			t.Fatalf("issue ended with %v, want the cancellation", err)
		}
		return signer.sent()[before:]
	}
	first := renew(3)
	for i, csr := range first {
		if csr != first[0] {
			t.Fatalf("attempt %d of one renewal sent another CSR", i+1)
		}
	}
	if csr, err := pki.ParseCSR([]byte(first[0])); err != nil || len(csr.URIs) != 1 || csr.URIs[0].String() != "spiffe://cluster.local/ns/shop/sa/web" {
		t.Fatalf("the CSR sent: %v", err)
	}
	if next := renew(1); next[0] == first[0] {
		t.Fatal("the next renewal reused the last one's key")
	}
}
