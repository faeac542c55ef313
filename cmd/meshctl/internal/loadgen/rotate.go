package loadgen

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/busrpc"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
)

// flushers bounds the storm pods' connections flushed at once.
const flushers = 64

// Rotation is a root rotation of the storm's live pods through the real signer
// and rotator: from the signer's answer to the rotate request until every pod
// held a certificate of the new root generation, each pod renewing when the
// rotator's renew command reached it, as sds-edge does.
type Rotation struct {
	NewKey    bool    `json:"new_key"`
	Pods      int     `json:"pods"`
	Rotated   int     `json:"rotated"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"pods_per_second"`
	// Commands counts the renew commands the pods received (one each when none was
	// repeated); SignerCPUMicroPerPod is the signer's CPU per rotated pod.
	Commands             int     `json:"renew_commands"`
	SignerCPUMicroPerPod float64 `json:"signer_cpu_us_per_pod,omitempty"`
}

func (ro *Rotation) writeText(w io.Writer) {
	key := "same key"
	if ro.NewKey {
		key = "new key"
	}
	fmt.Fprintf(w, "rotation    root (%s): %d of %d pods certified under the new root in %.2f s (%.0f pods/s), %d renew commands, signer %.0f µs CPU per pod\n",
		key, ro.Rotated, ro.Pods, ro.Seconds, ro.PerSecond, ro.Commands, ro.SignerCPUMicroPerPod)
}

// renewals follows the live pods through a rotation: how many renew commands
// reached them, how many hold a certificate of a newer root, and when the last
// one did.
type renewals struct {
	rotated, commands atomic.Int64
	last              latest
}

// rotateStorm rotates the root through the stack's signer (on the connection
// admin makes) and follows the storm's live pods through it: each pod renews when
// the rotator's renew command reaches it on its own subject
// (events.PodRenewSubject), as sds-edge does, until it holds a certificate of a
// newer root generation than the storm gave it. The time is counted from the
// signer's answer to the rotate request to the last pod's new certificate.
func rotateStorm(ctx context.Context, sim []*simPod, admin func(context.Context) (*nats.Conn, error), newKey bool, signer cpuReader) (*Rotation, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends renewals still retrying when the time is up
	var live []*simPod
	for _, p := range sim {
		if p.conn != nil && p.generation.Load() != 0 {
			live = append(live, p)
		}
	}
	res := &Rotation{NewKey: newKey, Pods: len(live)}
	var rn renewals
	for _, p := range live {
		if err := rn.follow(ctx, p); err != nil {
			return nil, err
		}
	}
	if err := flushAll(ctx, live); err != nil { // every subscription in place before the rotation
		return nil, err
	}
	nc, err := admin(ctx)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	s0, sErr := signer.read()
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = busrpc.RotateRoot(rctx, nc, events.RotateRequest{NewKey: newKey, Reason: "meshctl bench storm -rotate"})
	rcancel()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	rn.wait(ctx, len(live))
	res.Rotated, res.Commands = int(rn.rotated.Load()), int(rn.commands.Load())
	res.Seconds = rn.last.since(start)
	if res.Seconds > 0 {
		res.PerSecond = float64(res.Rotated) / res.Seconds
	}
	if s1, err := signer.read(); sErr == nil && err == nil && res.Rotated > 0 {
		res.SignerCPUMicroPerPod = (s1 - s0) * 1e6 / float64(res.Rotated)
	}
	return res, nil
}

// follow subscribes p to its renew commands: on each it asks for a certificate,
// and counts p rotated the first time one is of a newer root.
func (rn *renewals) follow(ctx context.Context, p *simPod) error {
	subject, err := events.PodRenewSubject(p.pod)
	if err != nil {
		return err
	}
	before := p.generation.Load()
	var done atomic.Bool
	_, err = p.conn.Subscribe(subject, func(m *nats.Msg) {
		if _, _, err := events.Decode[events.RenewDue](m); err != nil {
			return
		}
		rn.commands.Add(1)
		go func() {
			if err := p.certify(ctx, p.conn); err != nil || p.generation.Load() <= before || !done.CompareAndSwap(false, true) {
				return
			}
			rn.rotated.Add(1)
			rn.last.mark()
		}()
	})
	if err != nil {
		return fmt.Errorf("pod %s: subscribe to its renew commands: %w", p.pod, err)
	}
	return nil
}

// wait returns once pods have rotated, or when ctx ends.
func (rn *renewals) wait(ctx context.Context, pods int) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for rn.rotated.Load() < int64(pods) {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// flushAll flushes the pods' connections, flushers at a time, so that their
// subscriptions are in place at the server.
func flushAll(ctx context.Context, pods []*simPod) error {
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
	for _, p := range pods {
		next <- p
	}
	close(next)
	wg.Wait()
	return flushErr
}
