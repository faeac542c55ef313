package loadgen

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// simPod is one simulated pod: its token file, identity subject and CSR.
type simPod struct {
	pod     events.PodRef
	token   string
	file    string
	subject string
	csr     string
	// conn is the connection the pod asks for certificates on; generation is the
	// root generation of its latest certificate.
	conn       *nats.Conn
	generation atomic.Uint64
}

// preparePods makes the layout's pods, storm-0, storm-1, ..., each with a token
// minted for it (written under dir) and a CSR.
func preparePods(cfg StormConfig, dir string) ([]*simPod, error) {
	now := time.Now()
	ns, sa := cfg.Namespace, cfg.ServiceAccount
	pods := make([]*simPod, cfg.Layout.Pods)
	for i := range pods {
		p := &simPod{pod: events.PodRef{Namespace: ns, Name: fmt.Sprintf("storm-%d", i)}}
		var err error
		if p.token, err = cfg.Issuer.MintForPod(ns, sa, p.pod.Name, cfg.Stack.TokenIssuer.Audience, time.Hour, now); err != nil {
			return nil, err
		}
		p.file = filepath.Join(dir, p.pod.Name)
		if err := os.WriteFile(p.file, []byte(p.token), 0o600); err != nil {
			return nil, err
		}
		if p.subject, err = events.IdentitySignSubject(p.pod, sa); err != nil {
			return nil, err
		}
		key, err := pki.GenerateKey(pki.ECP256)
		if err != nil {
			return nil, err
		}
		csr, err := pki.NewCSR(key, "spiffe://storm.invalid/ns/"+ns+"/sa/"+sa)
		if err != nil {
			return nil, err
		}
		p.csr = string(csr)
		pods[i] = p
	}
	return pods, nil
}

// connect opens the pod's n connections at once, as its processes do.
func (p *simPod) connect(ctx context.Context, natsURL, tlsCA string, n int, log hclog.Logger) ([]*nats.Conn, error) {
	ncs := make([]*nats.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			cfg := bus.Config{URL: natsURL, TokenFile: p.file, Name: fmt.Sprintf("storm/%s/%d", p.pod, i), TLS: bus.TLSConfig{CAFile: tlsCA}}
			cfg.AsPod(p.pod, p.file)
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

// certify asks for the pod's certificate on its identity subject until answered,
// and keeps the root generation it was signed under.
func (p *simPod) certify(ctx context.Context, nc *nats.Conn) error {
	retry := bus.Reconnect.Start()
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		// The deadline travels with the request, as sds-edge sends it: the signer
		// signs nothing for a request whose pod has stopped waiting.
		deadline, _ := rctx.Deadline()
		rep, err := busrpc.Sign(rctx, nc, p.subject, events.SignRequest{CSR: p.csr, Token: p.token, KeyAlgorithm: string(pki.ECP256), Deadline: deadline}, "sign")
		cancel()
		if err == nil && rep.Error == nil {
			p.generation.Store(rep.Generation)
			return nil
		}
		if err == nil {
			err = rep.Error
		}
		if !backoff.Wait(ctx, clock.Real{}, retry.Next()) {
			return err
		}
	}
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
			t.counts[paths.ReplaceAllString(addrs.ReplaceAllString(fmt.Sprint(args[i+1]), "<addr>"), " <file>")]++
			t.mu.Unlock()
		}
	}
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
