package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/atomicfile/certdir"
	"github.com/meshagent/meshagent/pkg/buildinfo"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// runStatus summarises the local stack's processes (when there is one) and the
// fleet — signers, rotators, pods, roots, renewals due, failures — from the
// inventory (its records and the last hour's counts the operator service keeps
// there), and fails when something needs attention.
func runStatus(ctx context.Context, env Env, args []string) error {
	var dir string
	var bf busFlags
	var ff fleetFlags
	fs := readerFlags("status", env, &dir, &bf)
	ff.bind(fs)
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	st, err := bf.stackFor(dir)
	if err != nil {
		return err
	}
	var attention []string
	if st != nil {
		attention = append(attention, stackStatus(ctx, env.Stdout, st)...)
	}
	attention = append(attention, fleetStatus(ctx, env.Stdout, &bf, &ff, st, time.Now())...)
	if len(attention) == 0 {
		fmt.Fprintln(env.Stdout, "\nall well")
		return nil
	}
	fmt.Fprintln(env.Stdout, "\nNEEDS ATTENTION")
	for _, a := range attention {
		fmt.Fprintf(env.Stdout, "  - %s\n", a)
	}
	return fmt.Errorf("%d thing(s) need attention", len(attention))
}

// stackStatus prints each child process's readiness and each demo pod's files.
func stackStatus(ctx context.Context, w io.Writer, st *stackfile.Stack) []string {
	var attention []string
	client := &http.Client{Timeout: 10 * time.Second}
	fmt.Fprintln(w, buildinfo.String("meshctl"))
	fmt.Fprintf(w, "NATS %s\n", st.NATSURL)
	if st.Dashboard != "" {
		fmt.Fprintf(w, "dashboard http://%s/\n", st.Dashboard)
	}
	fmt.Fprintf(w, "\n%-22s %-7s %-22s %-14s %s\n", "SERVICE", "PID", "HTTP", "VERSION", "READY")
	for _, p := range st.Processes {
		ready := readyz(ctx, client, p.HTTP)
		version := versionOf(ctx, client, p.HTTP)
		if ready != "ready" {
			attention = append(attention, fmt.Sprintf("%s is %s (log %s)", p.Name, ready, p.Log))
		}
		pid := strconv.Itoa(p.PID)
		if !alive(p.PID) {
			pid += "?" // not running: the stack is gone, or stack.json is older than a restart
		}
		fmt.Fprintf(w, "%-22s %-7s %-22s %-14s %s\n", p.Name, pid, p.HTTP, version, ready)
	}
	fmt.Fprintf(w, "\n%-10s %-18s %-26s %s\n", "POD", "SERIAL", "EXPIRES (OUTPUT_CERTS)", "ROOT (sha256)")
	for _, p := range st.Pods {
		serial, expires, root := "-", "-", "-"
		if data, err := os.ReadFile(filepath.Join(p.OutputCerts, certdir.ChainFile)); err == nil {
			if cs, err := pki.ParseCertsPEM(data); err == nil {
				serial = pki.SerialHex(cs[0])
				expires = fmt.Sprintf("%s (in %s)", cs[0].NotAfter.Local().Format("15:04:05"), humanDuration(time.Until(cs[0].NotAfter)))
			}
		}
		if data, err := os.ReadFile(filepath.Join(p.OutputCerts, certdir.RootFile)); err == nil {
			if cs, err := pki.ParseCertsPEM(data); err == nil {
				fps := make([]string, len(cs))
				for i, c := range cs {
					fps[i] = pki.Fingerprint(c)[:12]
				}
				root = strings.Join(fps, ",")
			}
		}
		fmt.Fprintf(w, "%-10s %-18s %-26s %s\n", p.ID, short(serial, 16), expires, root)
	}
	return attention
}

// fleetStatus prints the fleet's summary from the bus and the operator's counts
// and returns what needs attention.
func fleetStatus(ctx context.Context, w io.Writer, bf *busFlags, ff *fleetFlags, st *stackfile.Stack, now time.Time) []string {
	fmt.Fprintln(w, "\nFLEET")
	nc, err := bf.reader(ctx, st, "meshctl status")
	if err != nil {
		return []string{fmt.Sprintf("bus: %v", err)}
	}
	defer nc.Close()
	row := func(k, f string, a ...any) { fmt.Fprintf(w, "  %-14s %s\n", k, fmt.Sprintf(f, a...)) }

	// Signers: one must answer; who issued lately is in the events.
	var attention []string
	var bundle []inventory.Root
	if reply, err := askBundle(ctx, nc); err != nil {
		row("signers", "NOT ANSWERING (%v)", err)
		attention = append(attention, "signers: no signer answers a trust bundle request")
	} else {
		row("signers", "answering (trust bundle generation %d, %d root(s))", reply.Generation, len(reply.Roots))
		bundle = inventory.RootsFromPEM(reply.Roots)
	}
	attention = append(attention, replication(ctx, nc, row)...)

	// The fleet's counts, one page of the operator's index: what the fleet holds
	// costs what a page costs.
	src := ff.source(st, nc)
	start := time.Now()
	p, err := src.Page(ctx, url.Values{"limit": {"1"}})
	if err != nil {
		row("inventory", "%v", err)
		return append(attention, fmt.Sprintf("inventory: %v", err))
	}
	if line := loadingLine(p); line != "" {
		row("inventory", "%s", strings.TrimPrefix(line, "note: "))
	}
	row("inventory", "from %s in %s", src, time.Since(start).Round(time.Millisecond))
	hour := p.Counts.LastHour
	row("", "issued in the last hour: %d%s", hour.IssuedTotal(), byKey(hour.Issued))
	row("rotators", "renewals sent in the last hour: %d%s, by %s", hour.RenewalTotal(), byKey(hour.Renewals), orNone(keys(hour.Rotators)))
	// meshctl bench's load is not the fleet.
	if p.Counts.Bench > 0 {
		row("bench", "%d certificate(s) of meshctl bench (namespace %s) not counted", p.Counts.Bench, events.BenchNamespace)
	}
	attention = append(attention, certStatus(ctx, src, p, now, row)...)
	if bundle == nil && p.Trust != nil { // the signers' answer first, else the last trust.changed
		bundle = p.Trust.Roots
	}
	attention = append(attention, rootStatus(bundle, now, row)...)
	if plan, err := askRotation(ctx, nc); err == nil {
		row("rotation", "%s", rotationPhase(plan, now))
	}
	attention = append(attention, meshRootStatus(p.Counts, bundle, row)...)
	attention = append(attention, goneStatus(ctx, src, p.Counts, row)...)
	return attention
}

// certStatus prints the pods and their certificates from the fleet's counts and
// returns what needs attention: each expired or overdue certificate (the first
// few, and how many), malformed records.
func certStatus(ctx context.Context, src fleetSource, p inventory.Page, now time.Time, row func(k, f string, a ...any)) []string {
	var attention []string
	n := p.Counts
	if k := len(p.Skipped); k > 0 {
		snap := inventory.Snapshot{Skipped: p.Skipped}
		row("inventory", "%d malformed record(s) skipped", k)
		attention = append(attention, strings.TrimPrefix(snap.SkippedLine(), "warning: ")+
			" (written with the inventory credential: the operator service replaces a record with the next certificate of its holder)")
	}
	row("pods", "%d up, %d down", n.Pods, n.DownPods)
	row("certificates", "%d current; %d due for renewal in the next hour; %d expired; %d renewal(s) overdue", n.Certificates, n.RenewIn1h, n.Expired, n.Overdue)
	if len(n.Named) > 0 {
		var parts []string
		for _, k := range keys(n.Named) {
			parts = append(parts, fmt.Sprintf("%s %d", k, n.Named[k]))
		}
		// Not a broken chain: a named signer's chain ends at its own CA's root.
		row("named signers", "%s certificate(s), under their own roots (CERT_SIGNERS), not the mesh's", strings.Join(parts, ", "))
	}
	if n.Expired+n.Overdue == 0 {
		return attention
	}
	const shown = 20
	late, err := src.Page(ctx, url.Values{"state": {"overdue"}, "limit": {fmt.Sprint(shown)}})
	if err != nil {
		return append(attention, fmt.Sprintf("%d certificate(s) expired or overdue (listing them: %v)", n.Expired+n.Overdue, err))
	}
	for _, c := range late.Certs {
		for _, warn := range c.Warnings(now, nil) {
			attention = append(attention, fmt.Sprintf("certificate of %s (%s, serial %s): %s", orDash(c.Pod), c.SPIFFEID, short(c.Serial, 16), warn))
		}
	}
	if late.Total > len(late.Certs) {
		attention = append(attention, fmt.Sprintf("... and %d more expired or overdue: meshctl certs -state overdue -offset %d", late.Total-len(late.Certs), len(late.Certs)))
	}
	return attention
}

// meshRootStatus returns the mesh certificates under a root the bundle does not
// hold (named signers' are under their own roots by design).
func meshRootStatus(n inventory.Counts, bundle []inventory.Root, row func(k, f string, a ...any)) []string {
	if bundle == nil {
		return nil
	}
	var attention []string
	for _, fp := range keys(n.MeshRoots) {
		if !slices.ContainsFunc(bundle, func(r inventory.Root) bool { return r.Fingerprint == fp }) {
			attention = append(attention, fmt.Sprintf("%d certificate(s) under root %s: root not in bundle (meshctl certs -root %s)", n.MeshRoots[fp], short(fp, 16), short(fp, 16)))
		}
	}
	return attention
}

// goneStatus tells holders that no longer answer — told to renew, then told again
// with no new certificate: a pod or VM gone without a pod.down, or one failing to
// renew — from failures that need attention. Their renewal retries are theirs: a
// gone holder is named, not counted as a failure; NACKs, and retries with no such
// holder, are failures.
func goneStatus(ctx context.Context, src fleetSource, n inventory.Counts, row func(k, f string, a ...any)) []string {
	hour := n.LastHour
	if n.Silent > 0 {
		names := ""
		if g, err := src.Page(ctx, url.Values{"state": {"silent"}, "sort": {"pod"}, "limit": {"5"}}); err == nil {
			var ps []string
			for _, c := range g.Certs {
				ps = append(ps, cmp.Or(c.Pod, c.SPIFFEID))
			}
			names = ": " + strings.Join(ps, ", ")
			if g.Total > len(g.Certs) {
				names += ", ..."
			}
		}
		row("gone", "%d holder(s) told to renew again with no new certificate (gone, or failing: meshctl describe pod)%s", n.Silent, names)
	}
	retries := hour.Retries()
	row("failures", "in the last hour: %d SDS NACK(s), %d xDS NACK(s), %d renewal retr(ies)", hour.SDSNacks, hour.XDSNacks, retries)
	if n.Silent > 0 && retries > 0 {
		row("", "renewal retries are to the %d holder(s) above, not counted as failures", n.Silent)
		retries = 0
	}
	if f := hour.SDSNacks + hour.XDSNacks + retries; f > 0 {
		return []string{fmt.Sprintf("%d failure(s) in the last hour: meshctl events --since 1h --type sds.nack,xds.nack,rotation.renew_due", f)}
	}
	return nil
}

// rootStatus prints the roots of the trust bundle and returns each that should
// have been rotated.
func rootStatus(bundle []inventory.Root, now time.Time, row func(k, f string, a ...any)) []string {
	if bundle == nil {
		row("roots", "unknown (no signer answers, no trust.changed in the inventory)")
		return nil
	}
	var attention []string
	for i, r := range bundle {
		k := ""
		if i == 0 {
			k = "roots"
		}
		left := r.NotAfter.Sub(now)
		row(k, "%s  %s  expires in %s", r.Fingerprint[:16], r.Subject, humanDuration(left))
		// The signer rotates a root with a fifth of its life left (Istio's grace
		// percentile): less than that means it has not.
		if left < r.NotAfter.Sub(r.NotBefore)/5 {
			attention = append(attention, fmt.Sprintf("root %s expires in %s and was not rotated", r.Fingerprint[:16], humanDuration(left)))
		}
	}
	return attention
}

// replication prints how the streams an audit credential may inspect are
// replicated (the event streams and the inventory bucket; the CA's buckets are the
// signers' and rotators' to report, in their stream_replicas_unhealthy metrics) and
// returns each one that is degraded: one more node loss may stop its writes.
func replication(ctx context.Context, nc *nats.Conn, row func(k, f string, a ...any)) []string {
	js, err := jetstream.New(nc)
	if err != nil {
		return []string{fmt.Sprintf("replication: %v", err)}
	}
	var attention []string
	k := "replication"
	for _, name := range []string{events.StreamEvents, events.StreamPodEvents, "KV_" + policy.BucketInventory} {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := bus.StreamReplication(cctx, js, name)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			continue
		case err != nil:
			row(k, "%s: unknown (%v)", name, err)
			attention = append(attention, fmt.Sprintf("replication of %s unknown: %v", name, err))
		case r.Healthy():
			row(k, "%s", r)
		default:
			row(k, "DEGRADED %s", r)
			attention = append(attention, fmt.Sprintf("stream %s degraded (one more node loss may stop its writes): %s", name, strings.Join(r.Problems, "; ")))
		}
		k = ""
	}
	return attention
}

// byKey is " (k1 n1, k2 n2)", "" for none.
func byKey(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	var parts []string
	for _, k := range keys(m) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return slices.Clip(out)
}

func orNone(ks []string) string {
	if len(ks) == 0 {
		return "none"
	}
	return strings.Join(ks, ", ")
}

// versionOf is the version a service names on its /healthz ("-" when it does not answer).
func versionOf(ctx context.Context, c *http.Client, addr string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
	if err != nil {
		return "-"
	}
	resp, err := c.Do(req)
	if err != nil {
		return "-"
	}
	defer resp.Body.Close()
	return orDash(short(resp.Header.Get(buildinfo.Header), 40))
}

func readyz(ctx context.Context, c *http.Client, addr string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return err.Error()
	}
	var connected atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected.Store(true) }}))
	start := time.Now()
	resp, err := c.Do(req)
	switch {
	case err != nil && connected.Load():
		// Up, but slow (a loaded machine, a replica busy loading): not unreachable.
		return fmt.Sprintf("slow: connected, no answer after %s", time.Since(start).Round(time.Millisecond))
	case err != nil:
		return fmt.Sprintf("unreachable (%s after %s)", errors.Unwrap(err), time.Since(start).Round(time.Millisecond))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode == http.StatusOK {
		return "ready"
	}
	return "not ready: " + strings.TrimSpace(string(body))
}

func short(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// alive reports whether a process with this pid runs (signal 0 reaches it).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	p, err := os.FindProcess(pid)
	return err == nil && p.Signal(syscall.Signal(0)) == nil
}
