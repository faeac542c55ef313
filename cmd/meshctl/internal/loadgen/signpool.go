package loadgen

import (
	"cmp"
	"context"
	"crypto"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats.go"
)

// signPool is n prepared sign requests encoded as enc, each with its own key's
// CSR, request i on subject(i) with token i modulo len(toks); request makes one
// more with a new CSR of a pool key. A request is never sent twice: the signer
// answers a repeated CSR with the certificate it already recorded for it (a retry
// after a lost answer), which costs it no signature.
type signPool struct {
	// mint, when set, is the token of the i-th identity: request i past the pool
	// asks as identity i.
	mint    func(i int) (string, error)
	msgs    []*nats.Msg
	keys    []crypto.Signer
	toks    []string
	alg     pki.KeyAlg
	enc     events.Encoding
	subject func(i int) string
	// timeout bounds one request's wait for its answer (SignConfig.RequestTimeout).
	timeout time.Duration
}

// signPoolID is the identity the CSRs ask for: the signer names the certificate
// after the token, not the CSR.
const signPoolID = "spiffe://bench.invalid/ns/bench/sa/load"

func newSignPool(alg pki.KeyAlg, enc events.Encoding, toks []string, n int, subject func(i int) string) (*signPool, error) {
	p := &signPool{msgs: make([]*nats.Msg, n), keys: make([]crypto.Signer, n), toks: toks, alg: alg, enc: enc, subject: subject}
	for i := range p.msgs {
		key, err := pki.GenerateKey(alg)
		if err != nil {
			return nil, err
		}
		p.keys[i] = key
		if p.msgs[i], err = p.request(i, i); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// request makes the n-th request sent with pool entry i: a new CSR of i's key (a
// new signature: a CSR never seen before) and i's token, or, past the pool with
// mint set, the n-th identity's.
func (p *signPool) request(i, n int) (*nats.Msg, error) {
	csr, err := pki.NewCSR(p.keys[i], signPoolID)
	if err != nil {
		return nil, err
	}
	tok := p.toks[i%len(p.toks)]
	if n >= len(p.msgs) && p.mint != nil {
		if tok, err = p.mint(n); err != nil {
			return nil, err
		}
	}
	req := events.SignRequest{CSR: string(csr), Token: tok, KeyAlgorithm: string(p.alg)}
	return events.NewSignRequestMsg(p.subject(i), p.enc, "meshctl/bench", req)
}

// loadSign sends p's requests 0..count-1 (with dur set: until dur has passed, past
// the pool each with a new CSR of a pool key) with inFlight requesters and returns
// the sorted latencies. A refusal or a timeout ends the run with an error: a
// benchmark of failures measures nothing. Request m goes on conns[m%len(conns)]
// (its pod's connection, or the one).
func loadSign(ctx context.Context, conns []*nats.Conn, p *signPool, count int, dur time.Duration, inFlight int) ([]time.Duration, error) {
	var deadline time.Time
	if dur > 0 {
		deadline = time.Now().Add(dur)
	}
	var next atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	for range inFlight {
		wg.Go(func() {
			var mine []time.Duration
			defer func() { mu.Lock(); lat = append(lat, mine...); mu.Unlock() }()
			for {
				i := int(next.Add(1)) - 1
				if dur > 0 && time.Now().After(deadline) || dur == 0 && i >= count || ctx.Err() != nil {
					return
				}
				took, err := p.send(ctx, conns, i)
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
				mine = append(mine, took)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(lat) == 0 {
		return nil, errors.New("no request completed")
	}
	slices.Sort(lat)
	return lat, nil
}

// send sends the i-th request (past the pool, a new one of pool entry i modulo
// its size) and returns how long its answer took.
func (p *signPool) send(ctx context.Context, conns []*nats.Conn, i int) (time.Duration, error) {
	m := i % len(p.msgs)
	msg, err := p.msgs[m], error(nil)
	if i >= len(p.msgs) {
		if msg, err = p.request(m, i); err != nil {
			return 0, err
		}
	}
	t := time.Now()
	if err := signOnce(ctx, conns[m%len(conns)], msg, p.timeout); err != nil {
		return 0, err
	}
	return time.Since(t), nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

func signOnce(ctx context.Context, nc *nats.Conn, m *nats.Msg, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(timeout, DefaultRequestTimeout))
	defer cancel()
	resp, err := nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		return fmt.Errorf("sign over nats: %w", err)
	}
	reply, _, err := events.DecodeSignReply(resp)
	if err != nil {
		return fmt.Errorf("sign reply: %w", err)
	}
	if reply.Error != nil {
		return fmt.Errorf("signer refused: %w", reply.Error)
	}
	return nil
}
