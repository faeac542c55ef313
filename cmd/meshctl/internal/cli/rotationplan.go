package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/busrpc"
	"github.com/meshagent/meshagent/pkg/events"
)

// askRotation asks a signer for the live plan of the root rotation under way
// (a bundle request any role may make); nil when its CA does not rotate.
func askRotation(ctx context.Context, nc *nats.Conn) (*events.RotationPlan, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	reply, err := busrpc.Call[events.BundleReply](rctx, nc, events.SubjectTrustBundle, events.BundleRequest{Rotation: true}, "trust bundle request")
	if err != nil {
		return nil, err
	}
	if reply.Error != nil {
		return nil, reply.Error
	}
	return reply.Rotation, nil
}

// rotationPhase says in one line where the root rotation is at now: the phase,
// when the next one begins and when the old root leaves the bundle, as the
// signer plans it from the certificates signed so far (so the times can only
// come sooner than a plan printed at the rotation, which counted -max-ttl).
func rotationPhase(p *events.RotationPlan, now time.Time) string {
	at := func(t time.Time) string {
		return fmt.Sprintf("%s (in %s)", t.Local().Format("15:04:05"), humanDuration(t.Sub(now)))
	}
	switch {
	case p == nil:
		return "no plan: this CA does not rotate its root (plugged-in material)"
	case p.Rotated.IsZero():
		return "none under way"
	case !p.OldRootLeaves.IsZero() && !now.Before(p.OldRootLeaves):
		return fmt.Sprintf("done: rotated %s ago, the old root left the bundle", humanDuration(now.Sub(p.Rotated)))
	case p.NewRootLast.Equal(p.Rotated):
		return fmt.Sprintf("same key, rotated %s ago; the old root leaves the bundle at %s", humanDuration(now.Sub(p.Rotated)), at(p.OldRootLeaves))
	}
	line := fmt.Sprintf("phase %d of 3 (new key, rotated %s ago)", p.Phase, humanDuration(now.Sub(p.Rotated)))
	switch p.Phase {
	case 1:
		line += "; phase 2 (the new root last in the replies) at " + at(p.NewRootLast)
	case 2:
		line += "; phase 3 (no cross-signed certificate) at " + at(p.Settled)
	}
	if !p.OldRootLeaves.IsZero() {
		line += "; the old root leaves the bundle at " + at(p.OldRootLeaves)
	}
	return line
}
