package devstack

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/supervisor"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
)

// podStart is one demo pod's launched processes: sds-edge, xds-relay and
// launcher, or the one `meshagent pod` process (-one-process-pods).
type podStart struct {
	id string
	ps []*supervisor.Process
}

func (p *podStart) procs() []*supervisor.Process { return p.ps }

// portsPerPod is how many loopback ports a demo pod listens on: each role's health
// address, the launcher's status, Envoy admin and Envoy stats addresses, and the
// relay's DNS proxy.
const portsPerPod = 7

// defaultResource is the SDS resource of a workload's own certificate (Istio's name).
const defaultResource = "default"

// startPods launches every demo pod's processes at once, then waits, by the events
// the pods and the signer publish, until each pod holds its certificate (cert.issued
// for it, or sds.pushed of default when it had one already) and its Envoy is ready
// (envoy.ready, which the launcher publishes only once sds-edge served default and
// ROOTCA and xds-relay was ready). Each process's /readyz then confirms it (one
// request each: the bus is not believed on its own). The pods' lines are printed
// after, in pod order, so that the summary reads as before.
func (r *Runner) startPods(ctx context.Context) error {
	if r.cfg.Pods == 0 {
		return nil
	}
	// Every port the pods listen on, reserved together: picked one at a time and
	// released before anything binds them, two children could get the same port.
	addrs, err := supervisor.FreeAddrs(r.cfg.Pods * portsPerPod)
	if err != nil {
		return err
	}
	r.addrs = addrs
	defer func() { r.addrs = nil }()

	w := newPodWaiter(time.Now())
	// Subscribed before the first pod starts, so that no pod's event is missed.
	for _, subj := range []string{events.SubjectCertIssued, events.PodEventWildcard(events.PodEventSecretPushed),
		events.PodEventWildcard(events.PodEventEnvoyReady)} {
		sub, err := r.nc.Subscribe(subj, w.observe)
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", subj, err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	if err := r.nc.Flush(); err != nil {
		return fmt.Errorf("subscribe pod events: %w", err)
	}
	var pods []*podStart
	for i := range r.cfg.Pods {
		ps, err := r.startPod(fmt.Sprintf("demo-%d", i), r.nodeOf(i))
		if err != nil {
			return err
		}
		pods = append(pods, ps)
	}
	fmt.Fprintf(r.out, "  %d pods starting, waiting for each to hold its certificate ...", len(pods))
	if err := w.wait(ctx, pods, r.cfg.ReadyWait); err != nil {
		fmt.Fprintln(r.out, " failed")
		return err
	}
	if err := r.confirmReady(ctx, pods); err != nil {
		fmt.Fprintln(r.out, " failed")
		return err
	}
	fmt.Fprintf(r.out, " all up (%s)\n", time.Since(w.began).Round(time.Millisecond))
	var out strings.Builder
	for _, p := range pods {
		cert, envoy := w.times(p.id)
		held := fmt.Sprintf("certificate held (%s)", cert.Round(time.Millisecond))
		ready := fmt.Sprintf("envoy ready (%s)", envoy.Round(time.Millisecond))
		if len(p.ps) == 1 { // one meshagent pod process
			fmt.Fprintf(&out, "  %-22s started, %s, %s\n", p.ps[0].Name, held, ready)
			continue
		}
		for i, proc := range p.ps {
			what := "ready"
			switch i {
			case 0:
				what = held
			case len(p.ps) - 1:
				what = ready
			}
			fmt.Fprintf(&out, "  %-22s started, %s\n", proc.Name, what)
		}
	}
	_, _ = fmt.Fprint(r.out, out.String())
	return nil
}

// confirmReady asks each pod process's /readyz, all at once, and hands it to the
// supervisor's watch (restarts) from then on.
func (r *Runner) confirmReady(ctx context.Context, pods []*podStart) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, pod := range pods {
		for _, p := range pod.procs() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := r.sup.Ready(ctx, p, r.cfg.ReadyWait); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// freeAddrs is n ports startPods reserved, or else n free ones.
func (r *Runner) freeAddrs(n int) ([]string, error) {
	if len(r.addrs) >= n {
		got := r.addrs[:n]
		r.addrs = r.addrs[n:]
		return got, nil
	}
	return supervisor.FreeAddrs(n)
}

// podWaiter records, from the bus, when each pod got its certificate and when its
// Envoy was ready.
type podWaiter struct {
	began   time.Time // before the first pod starts
	mu      sync.Mutex
	cert    map[events.PodRef]time.Duration // since began
	envoy   map[events.PodRef]time.Duration
	changed chan struct{} // a token when something was recorded
}

func newPodWaiter(began time.Time) *podWaiter {
	return &podWaiter{began: began, cert: map[events.PodRef]time.Duration{}, envoy: map[events.PodRef]time.Duration{}, changed: make(chan struct{}, 1)}
}

// observe records a cert.issued, sds.pushed or envoy.ready; anything else, or what
// does not decode, is ignored (wait's /readyz check is the judge).
func (w *podWaiter) observe(m *nats.Msg) {
	var (
		pod  events.PodRef
		into map[events.PodRef]time.Duration
	)
	if m.Subject == events.SubjectCertIssued {
		ev, _, err := events.Decode[events.CertIssued](m)
		if err != nil {
			return
		}
		pod, into = ev.Pod, w.cert
	} else {
		var ok bool
		if pod, ok = events.PodFromSubject(m.Subject); !ok {
			return
		}
		switch kind, _ := events.PodEventKind(m.Subject); kind {
		case events.PodEventSecretPushed:
			ev, _, err := events.Decode[events.SecretPushed](m)
			if err != nil || ev.Pod != pod || ev.Resource != defaultResource {
				return
			}
			into = w.cert
		case events.PodEventEnvoyReady:
			into = w.envoy
		default:
			return
		}
	}
	w.mu.Lock()
	if _, seen := into[pod]; !seen && !pod.IsZero() {
		into[pod] = time.Since(w.began)
	}
	w.mu.Unlock()
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// times is when demo pod id got its certificate and when its Envoy was ready.
func (w *podWaiter) times(id string) (cert, envoy time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cert[demoPod(id)], w.envoy[demoPod(id)]
}

// missing lists what each pod has not shown yet.
func (w *podWaiter) missing(pods []*podStart) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, p := range pods {
		if _, ok := w.cert[demoPod(p.id)]; !ok {
			out = append(out, p.id+": certificate")
		}
		if _, ok := w.envoy[demoPod(p.id)]; !ok {
			out = append(out, p.id+": envoy.ready")
		}
	}
	return out
}

// wait returns once every pod has shown its certificate and its Envoy ready, or
// with the error of the first pod process that exits, or after limit.
func (w *podWaiter) wait(ctx context.Context, pods []*podStart, limit time.Duration) error {
	stop := make(chan struct{})
	defer close(stop)
	var procs []*supervisor.Process
	for _, p := range pods {
		procs = append(procs, p.procs()...)
	}
	exited := make(chan *supervisor.Process, len(procs))
	for _, p := range procs {
		go func() {
			select {
			case <-p.Done():
				exited <- p
			case <-stop:
			}
		}()
	}
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		missing := w.missing(pods)
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-w.changed:
		case p := <-exited:
			return p.ExitError()
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			if len(missing) > 10 {
				missing = append(slices.Clip(missing[:10]), fmt.Sprintf("and %d more", len(missing)-10))
			}
			return fmt.Errorf("pods not up after %s; still missing: %s", limit, strings.Join(missing, ", "))
		}
	}
}
