package devstack

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/supervisor"
	"github.com/meshagent/meshagent/pkg/bus/policy"
)

// startOperator runs the operator service (the inventory keeper and the
// dashboard) under the supervisor, as the inventory role, once the signer has
// made the event stream. Its HTTP address is the dashboard's: the page, its API
// and the fleet metrics beside /healthz and /readyz.
func (r *Runner) startOperator(ctx context.Context) error {
	addr := r.cfg.DashboardAddr
	if _, port, err := net.SplitHostPort(addr); addr == "" || err == nil && port == "0" {
		// The supervisor asks the child's /readyz at the address it was given: a
		// free loopback port chosen here, not by the child.
		if addr, err = supervisor.FreeAddr(); err != nil {
			return err
		}
	} else {
		// A port that is taken (an earlier stack still running) is a clear error
		// here, not a /readyz answered by someone else.
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("dashboard (-dashboard-addr %s): %w", addr, err)
		}
		_ = ln.Close()
	}
	args := []string{"-instance", "operator-0", "-nats-nkey", r.creds.SeedFile(policy.Inventory)}
	if len(r.cfg.DashboardHosts) > 0 {
		args = append(args, "-allowed-hosts", strings.Join(r.cfg.DashboardHosts, ","))
	}
	p, err := r.spawnAt(ctx, "operator", "operator", addr, nil, args...)
	if err != nil {
		return fmt.Errorf("dashboard (-dashboard-addr %s): %w", addr, err)
	}
	r.Stack.Dashboard = p.HTTP
	return nil
}
