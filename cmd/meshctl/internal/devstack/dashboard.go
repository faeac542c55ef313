package devstack

import (
	"context"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/dashboard"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
)

// startDashboard runs meshctl serve's server in meshctl's own process, as the
// inventory role (its own credential), once the signer has made the event stream.
func (r *Runner) startDashboard(ctx context.Context) error {
	addr := r.cfg.DashboardAddr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	log := r.log.Named("serve")
	nc, err := bus.Connect(ctx, bus.Config{URL: r.natsURL(), Name: "meshctl serve", NKeyFile: r.creds.SeedFile(policy.Inventory),
		InboxPrefix: policy.Inbox(policy.Inventory, events.PodRef{}), ConnectWait: 5 * time.Second}, log)
	if err != nil {
		return fmt.Errorf("dashboard: %w", err)
	}
	s, err := dashboard.New(dashboard.Config{Addr: addr, Replicas: 1}, nc, log)
	if err != nil {
		nc.Close()
		return err
	}
	dctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(dctx) }()
	r.stopDashboard = func() {
		cancel()
		<-done
		nc.Close()
	}
	select {
	case <-s.Bound():
	case err := <-done:
		// Run has returned: stopping must not wait for it again (Stop hung here
		// when the address was taken).
		r.stopDashboard = func() { nc.Close() }
		return fmt.Errorf("dashboard (-dashboard-addr %s): %w", addr, err)
	case <-ctx.Done():
		return ctx.Err()
	}
	r.Stack.Dashboard = s.Addr().String()
	return nil
}
