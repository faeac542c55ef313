package cli

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
)

// flushers bounds the storm pods' connections flushed at once.
const flushers = 64

// rotateStorm rotates the root through the stack's signer and follows the storm's
// live pods through it: each pod renews when the rotator's renew command reaches
// it on its own subject (events.PodRenewSubject), as sds-edge does, until it holds
// a certificate of a newer root generation than the storm gave it. The time is
// counted from the signer's answer to the rotate request to the last pod's new
// certificate.
func rotateStorm(ctx context.Context, sim []*simPod, bf *busFlags, st *stackfile.Stack, newKey bool, signer cpuReader) (*StormRotation, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends renewals still retrying when the time is up
	var live []*simPod
	for _, p := range sim {
		if p.conn != nil && p.generation.Load() != 0 {
			live = append(live, p)
		}
	}
	res := &StormRotation{NewKey: newKey, Pods: len(live)}
	var rotated, commands atomic.Int64
	var last latest
	for _, p := range live {
		subject, err := events.PodRenewSubject(p.pod)
		if err != nil {
			return nil, err
		}
		before := p.generation.Load()
		var done atomic.Bool
		if _, err := p.conn.Subscribe(subject, func(m *nats.Msg) {
			if _, _, err := events.Decode[events.RenewDue](m); err != nil {
				return
			}
			commands.Add(1)
			go func() {
				if err := p.certify(ctx, p.conn); err != nil || p.generation.Load() <= before || !done.CompareAndSwap(false, true) {
					return
				}
				rotated.Add(1)
				last.mark()
			}()
		}); err != nil {
			return nil, fmt.Errorf("pod %s: subscribe to its renew commands: %w", p.pod, err)
		}
	}
	// Every subscription in place before the rotation.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var flushErr error
	next := make(chan *simPod)
	for range flushers {
		wg.Go(func() {
			for p := range next {
				if err := p.conn.FlushWithContext(ctx); err != nil {
					mu.Lock()
					flushErr = fmt.Errorf("pod %s: subscribe to its renew commands: %w", p.pod, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, p := range live {
		next <- p
	}
	close(next)
	wg.Wait()
	if flushErr != nil {
		return nil, flushErr
	}
	admin, err := bf.connect(ctx, st, "meshctl bench storm")
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	s0, sErr := signer.read()
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = rotateCall(rctx, admin, events.RotateRequest{NewKey: newKey, Reason: "meshctl bench storm -rotate"})
	rcancel()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
wait:
	for rotated.Load() < int64(len(live)) {
		select {
		case <-ctx.Done():
			break wait
		case <-tick.C:
		}
	}
	res.Rotated, res.Commands = int(rotated.Load()), int(commands.Load())
	if l := last.get(); !l.IsZero() {
		res.Seconds = l.Sub(start).Seconds()
	}
	if res.Seconds > 0 {
		res.PerSecond = float64(res.Rotated) / res.Seconds
	}
	if s1, err := signer.read(); sErr == nil && err == nil && res.Rotated > 0 {
		res.SignerCPUMicroPerPod = (s1 - s0) * 1e6 / float64(res.Rotated)
	}
	return res, nil
}
