package devstack

import (
	"context"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/atomicfile"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/nats-io/nats.go"
)

// writeBundle asks the signer for the trust bundle, writes it, and rewrites it on
// every trust.changed.
func (r *Runner) writeBundle(ctx context.Context) error {
	req, err := events.NewMsg(events.SubjectTrustBundle, "meshctl", events.BundleRequest{})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := r.nc.RequestMsgWithContext(rctx, req)
	if err != nil {
		return fmt.Errorf("trust bundle: %w", err)
	}
	reply, _, err := events.Decode[events.BundleReply](resp)
	if err != nil {
		return fmt.Errorf("trust bundle: %w", err)
	}
	if reply.Error != nil {
		return fmt.Errorf("trust bundle: %w", reply.Error)
	}
	// The file follows trust.changed only when the event is endorsed by a root of the
	// bundle the signer gave us: whoever else gets a trust.changed onto the bus (a
	// leaked signer credential) cannot put a root into it.
	trust := trustbundle.New(r.cfg.TrustDomain, nil, nil)
	if _, _, err := trust.Accept(trustbundle.FromBundleReply(reply)); err != nil {
		return fmt.Errorf("trust bundle: %w", err)
	}
	if err := writePEMs(r.Stack.TrustBundle, reply.Roots); err != nil {
		return err
	}
	_, err = r.nc.Subscribe(events.SubjectTrustChanged, func(m *nats.Msg) {
		tc, _, err := events.Decode[events.TrustChanged](m)
		var u trustbundle.Update
		if err == nil {
			u, _, err = trust.Accept(trustbundle.FromTrustChanged(tc))
		}
		if err != nil {
			r.log.Warn("trust.changed refused", "error", err)
			return
		}
		if u.Stale {
			return
		}
		if err := writePEMs(r.Stack.TrustBundle, tc.Roots); err != nil {
			r.log.Error("write trust bundle", "error", err)
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe trust.changed: %w", err)
	}
	return nil
}

func writePEMs(path string, pems []string) error {
	var data []byte
	for _, p := range pems {
		data = append(data, p...)
	}
	return atomicfile.Write(path, data, 0o644)
}
