package devstack

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/supervisor"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
)

// spawn starts a service binary under the supervisor and waits for its /readyz.
func (r *Runner) spawn(ctx context.Context, name, bin string, args ...string) (*supervisor.Process, error) {
	return r.spawnEnv(ctx, name, bin, nil, args...)
}

// spawnEnv is spawn with env added to the service's environment.
func (r *Runner) spawnEnv(ctx context.Context, name, bin string, env []string, args ...string) (*supervisor.Process, error) {
	httpAddr, err := supervisor.FreeAddr()
	if err != nil {
		return nil, err
	}
	return r.spawnAt(ctx, name, bin, httpAddr, env, args...)
}

// spawnAt is spawnEnv with the service's HTTP address chosen by the caller.
func (r *Runner) spawnAt(ctx context.Context, name, bin, httpAddr string, env []string, args ...string) (*supervisor.Process, error) {
	p, err := r.process(name, bin, httpAddr, r.natsURL(), args)
	if err != nil {
		return nil, err
	}
	p.Env = env
	if err := r.start(ctx, p); err != nil {
		return nil, err
	}
	return p, nil
}

// launchPodRole starts a role of pod under the supervisor with its HTTP address
// chosen by the caller, without waiting for it (startPods waits for the pods by
// their events).
func (r *Runner) launchPodRole(pod stackfile.Pod, name, bin, httpAddr string, args ...string) (*supervisor.Process, error) {
	p, err := r.process(name, bin, httpAddr, r.podNATSURL(pod), args)
	if err != nil {
		return nil, err
	}
	p.Env = r.podEnv(pod)
	return p, r.launch(p)
}

// process is service bin as a child named name, told the bus (natsURL; none
// when empty) and its HTTP address.
func (r *Runner) process(name, bin, httpAddr, natsURL string, args []string) (*supervisor.Process, error) {
	path, lead, err := r.executable(bin)
	if err != nil {
		return nil, err
	}
	own := []string{"-http-addr", httpAddr}
	if natsURL != "" {
		own = append(own, "-nats-url", natsURL)
	}
	args = slices.Concat(lead, own, args)
	return &supervisor.Process{Name: name, Bin: path, HTTP: httpAddr, Args: args}, nil
}

// launch starts p, logging to logs/<name>.log, without waiting for it.
func (r *Runner) launch(p *supervisor.Process) error {
	p.LogPath = r.logPath(p.Name)
	return r.sup.Launch(p)
}

func (r *Runner) logPath(name string) string {
	return filepath.Join(r.cfg.Dir, "logs", strings.ReplaceAll(name, "/", "_")+".log")
}

// start starts p, logging to logs/<name>.log, and waits for its /readyz.
func (r *Runner) start(ctx context.Context, p *supervisor.Process) error {
	p.LogPath = r.logPath(p.Name)
	fmt.Fprintf(r.out, "  %-22s starting, waiting for /readyz ...", p.Name)
	began := time.Now()
	if err := r.sup.Start(ctx, p, r.cfg.ReadyWait); err != nil {
		fmt.Fprintln(r.out, " failed")
		return err
	}
	fmt.Fprintf(r.out, " ready (%s)\n", time.Since(began).Round(time.Millisecond))
	r.log.Debug("service ready", "name", p.Name, "http", p.HTTP)
	return nil
}

// podRoles are the services the shared executable meshagent runs as subcommands.
var podRoles = []string{"sds-edge", "xds-relay", "launcher"}

// executable is what runs service bin: for a pod role, the shared executable
// meshagent with the role as its first argument when it is there (the pod's
// processes then share its code pages), else the service's own binary.
func (r *Runner) executable(bin string) (path string, lead []string, err error) {
	if slices.Contains(podRoles, bin) {
		if p, err := supervisor.FindBinary(r.cfg.BinDir, "meshagent"); err == nil {
			return p, []string{bin}, nil
		}
	}
	path, err = supervisor.FindBinary(r.cfg.BinDir, bin)
	return path, nil, err
}
