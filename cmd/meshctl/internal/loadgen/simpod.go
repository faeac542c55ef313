package loadgen

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/busrpc"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats.go"
)

// simPod is one simulated pod: its token file, sign subject, key and CSR, and
// where it connects (its node's agent, or the hub).
type simPod struct {
	pod     events.PodRef
	node    string // "" without a node tier
	url     string
	tlsCA   string
	token   string
	file    string
	subject string
	csr     string
	pub     crypto.PublicKey
	// conn is the connection the pod asks for certificates on; generation is the
	// root generation of its latest certificate.
	conn       *nats.Conn
	generation atomic.Uint64
}

// connect opens the pod's n connections at once, as its processes do.
func (p *simPod) connect(ctx context.Context, n int, log hclog.Logger) ([]*nats.Conn, error) {
	ncs := make([]*nats.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			cfg := bus.Config{URL: p.url, TokenFile: p.file, Name: fmt.Sprintf("storm/%s/%d", p.pod, i), TLS: bus.TLSConfig{CAFile: p.tlsCA}}
			cfg.AsPod(p.pod, p.file)
			cfg.NodeLocal = p.node != ""
			cfg.ConnectWait = time.Until(deadlineOf(ctx))
			ncs[i], errs[i] = bus.Connect(ctx, cfg, log)
		})
	}
	wg.Wait()
	var got []*nats.Conn
	for _, nc := range ncs {
		if nc != nil {
			got = append(got, nc)
		}
	}
	return got, errors.Join(errs...)
}

func deadlineOf(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(time.Minute)
}

// signAttempt is a simulated pod's first wait for its answer.
const signAttempt = 10 * time.Second

// certify asks for the pod's certificate on its sign subject until answered,
// with its token in the request (as sds-edge sends it), checks that the
// certificate is for the pod's own key, and keeps the root generation it was
// signed under.
func (p *simPod) certify(ctx context.Context, nc *nats.Conn) error {
	retry := bus.Reconnect.Start()
	timedOut := 0
	for {
		// As sds-edge: each attempt in a row left unanswered gives the next twice
		// the time, up to a minute; a repeat is answered from the signer's record.
		rctx, cancel := context.WithTimeout(ctx, min(signAttempt<<min(timedOut, 6), time.Minute))
		// The deadline travels with the request, as sds-edge sends it: the signer
		// signs nothing for a request whose pod has stopped waiting.
		deadline, _ := rctx.Deadline()
		rep, err := busrpc.Sign(rctx, nc, p.subject, events.SignRequest{CSR: p.csr, Token: p.token, KeyAlgorithm: string(pki.ECP256), Deadline: deadline}, "sign")
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			timedOut++
		} else {
			timedOut = 0
		}
		if err == nil && rep.Error == nil {
			if err := p.check(rep); err != nil {
				return err
			}
			p.generation.Store(rep.Generation)
			return nil
		}
		wait := time.Duration(0)
		if err == nil {
			err = rep.Error
			// A busy signer's refusal names the pod's slot: come back then, as
			// sds-edge does, a little after rather than before.
			if slot := events.RetryAfterOf(rep.Error); slot > 0 {
				wait = slot + rand.N(slot/10+1)
			}
		}
		if wait == 0 {
			wait = retry.Next()
		}
		if !backoff.Wait(ctx, clock.Real{}, wait) {
			return err
		}
	}
}

// check reports whether rep's chain begins with a certificate of the pod's key.
func (p *simPod) check(rep events.SignReply) error {
	certs, err := pki.ParseCertPEMs(rep.CertChain)
	if err != nil || len(certs) == 0 {
		return fmt.Errorf("pod %s: reply chain: %w", p.pod, cmpErr(err, errors.New("empty")))
	}
	if k, ok := certs[0].PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(p.pub) {
		return fmt.Errorf("pod %s: %w", p.pod, errWrongKey)
	}
	return nil
}

// addrs are the socket addresses in an error, left out of its kind.
var addrs = regexp.MustCompile(`[0-9a-fA-F.:\[\]]+:[0-9]+(->[0-9a-fA-F.:\[\]]+:[0-9]+)?`)

// paths are the file names in errors (each simulated pod's token file): the tally
// counts an error once whatever pod it came from ("too many open files" in a
// 10,000-pod storm otherwise printed a line per pod).
var paths = regexp.MustCompile(`\s/[^\s:]+`)

// errTally counts the errors bus.Connect logs for its failed attempts.
type errTally struct {
	mu     sync.Mutex
	counts map[string]int
}

func (t *errTally) Accept(_ string, _ hclog.Level, _ string, args ...any) {
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == "error" {
			t.mu.Lock()
			t.counts[errKind(fmt.Sprint(args[i+1]))]++
			t.mu.Unlock()
		}
	}
}

// ids are the hex names in errors (a certificate record's key: the 100,000-pod
// storm printed a "failed 1 pods" line for each of 486 records not stored in time).
var ids = regexp.MustCompile(`\b[0-9a-f]{16,}\b`)

// errKind is an error's text without its addresses, file names and hex ids.
func errKind(s string) string {
	return ids.ReplaceAllString(paths.ReplaceAllString(addrs.ReplaceAllString(s, "<addr>"), " <file>"), "<id>")
}

// failedPrefix marks a tally's count of pods that failed (not of retried connects).
const failedPrefix = "\x00failed: "

// failed counts a pod that failed with err.
func (t *errTally) failed(err error) {
	t.mu.Lock()
	t.counts[failedPrefix+errKind(err.Error())]++
	t.mu.Unlock()
}

func (t *errTally) snapshot() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int, len(t.counts))
	for k, v := range t.counts {
		out[k] = v
	}
	return out
}
