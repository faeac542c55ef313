package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// checkResult is one pre-flight check: what was checked, whether it passed, and
// what to do when it did not.
type checkResult struct {
	Name, Detail, Fix string
	OK                bool
}

// Thresholds of meshctl check.
const (
	maxClockSkew  = 2 * time.Second
	rootHorizon   = 30 * 24 * time.Hour // a root that expires within this needs rotating
	permissionsIn = time.Second         // how long a refusal of the bus may take to arrive
)

// runCheck is a pre-flight of a running bus and fleet (linkerd check, spire-server
// healthcheck): the bus enforces roles, the event streams and the inventory are
// there with their replicas in quorum, a signer answers with a clock close to this
// one, the CA has roots far from expiry, no certificate is expired or overdue. It
// exits non-zero naming what to fix.
func runCheck(ctx context.Context, env Env, args []string) error {
	var dir string
	var bf busFlags
	var ff fleetFlags
	fs := readerFlags("check", env, &dir, &bf)
	ff.bind(fs)
	words, err := parseWords(fs, args)
	if err != nil {
		return err
	}
	if len(words) != 0 {
		return fmt.Errorf("%w: meshctl check [bus flags]", errUsage)
	}
	st, err := bf.stackFor(dir)
	if err != nil {
		return err
	}
	var results []checkResult
	nc, err := bf.reader(ctx, st, "meshctl check")
	if err != nil {
		results = append(results, checkResult{Name: "bus", Detail: err.Error(), Fix: "start the bus, or point -nats-url/-nats-nkey at it"})
		return report(env.Stdout, results)
	}
	defer nc.Close()
	results = append(results, checkResult{Name: "bus", OK: true, Detail: "connected to " + nc.ConnectedUrlRedacted()})
	results = append(results, checkPermissions(nc))
	results = append(results, checkStreams(ctx, nc)...)
	results = append(results, checkSigners(ctx, nc)...)
	results = append(results, checkFleet(ctx, ff.source(st, nc), time.Now())...)
	return report(env.Stdout, results)
}

// report prints the results and fails when one did not pass.
func report(w io.Writer, results []checkResult) error {
	failed := 0
	for _, r := range results {
		mark := "ok  "
		if !r.OK {
			mark = "FAIL"
			failed++
		}
		fmt.Fprintf(w, "%s %-22s %s\n", mark, r.Name, r.Detail)
		if !r.OK && r.Fix != "" {
			fmt.Fprintf(w, "     %-22s fix: %s\n", "", r.Fix)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d check(s) failed", failed)
	}
	fmt.Fprintln(w, "\nall checks passed")
	return nil
}

// checkPermissions asks the bus for what no reader may have, the sign requests
// (they carry bearer tokens): a bus that lets this credential subscribe does not
// enforce the roles.
func checkPermissions(nc *nats.Conn) checkResult {
	r := checkResult{Name: "roles enforced"}
	var refused atomic.Bool
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			refused.Store(true)
		}
	})
	sub, err := nc.SubscribeSync(events.SignWildcard)
	if err != nil {
		r.Detail = fmt.Sprintf("subscribe: %v", err)
		return r
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = nc.Flush()
	for deadline := time.Now().Add(permissionsIn); time.Now().Before(deadline) && !refused.Load(); {
		time.Sleep(20 * time.Millisecond)
	}
	if !refused.Load() {
		r.Detail = "this reader credential may read the sign requests (" + events.SignWildcard + "), which carry tokens"
		r.Fix = "run the bus with meshagent's roles (meshctl bus-auth -out DIR, docs/security.md); meshctl up does"
		return r
	}
	r.OK, r.Detail = true, "a reader is refused the sign requests"
	return r
}

// checkStreams looks up the event streams and the inventory: there, with a leader
// and every replica current.
func checkStreams(ctx context.Context, nc *nats.Conn) []checkResult {
	js, err := jetstream.New(nc)
	if err != nil {
		return []checkResult{{Name: "jetstream", Detail: err.Error(), Fix: "enable JetStream on the bus"}}
	}
	var out []checkResult
	for _, s := range []struct{ name, owner string }{
		{events.StreamEvents, "a signer creates it"}, {events.StreamPodEvents, "a signer creates it"},
		{"KV_" + policy.BucketInventory, "the operator service creates it"},
	} {
		r := checkResult{Name: "stream " + s.name}
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		st, err := js.Stream(sctx, s.name)
		var info *jetstream.StreamInfo
		if err == nil {
			info, err = st.Info(sctx)
		}
		cancel()
		switch {
		case err != nil:
			r.Detail, r.Fix = err.Error(), "start the service that owns it ("+s.owner+")"
		case info.Cluster != nil && info.Cluster.Leader == "" && info.Config.Replicas > 1:
			r.Detail, r.Fix = fmt.Sprintf("no leader (%d replicas)", info.Config.Replicas), "bring the NATS cluster's nodes back: a replicated stream needs a quorum"
		default:
			behind := 0
			if info.Cluster != nil {
				for _, p := range info.Cluster.Replicas {
					if !p.Current || p.Offline {
						behind++
					}
				}
			}
			r.Detail = fmt.Sprintf("%d message(s), %d replica(s)", info.State.Msgs, info.Config.Replicas)
			if behind > 0 {
				r.Detail += fmt.Sprintf(", %d not current", behind)
				r.Fix = "a NATS node is down or lagging: the stream keeps quorum, but one more loss stops writes"
			} else {
				r.OK = true
			}
		}
		out = append(out, r)
	}
	return out
}

// checkSigners asks for the trust bundle: a signer answers, its clock is close to
// this one, and every root is far from expiry.
func checkSigners(ctx context.Context, nc *nats.Conn) []checkResult {
	msg, err := events.NewMsg(events.SubjectTrustBundle, "meshctl", events.BundleRequest{})
	if err != nil {
		return []checkResult{{Name: "signers", Detail: err.Error()}}
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	sent := time.Now()
	resp, err := nc.RequestMsgWithContext(rctx, msg)
	got := time.Now()
	if err != nil {
		return []checkResult{{Name: "signers", Detail: "no signer answers a trust bundle request: " + err.Error(), Fix: "start a signer (services/signer) on this bus"}}
	}
	reply, meta, err := events.Decode[events.BundleReply](resp)
	if err == nil && reply.Error != nil {
		err = reply.Error
	}
	if err != nil {
		return []checkResult{{Name: "signers", Detail: "trust bundle: " + err.Error(), Fix: "see the signer's log"}}
	}
	out := []checkResult{{Name: "signers", OK: true, Detail: fmt.Sprintf("%s answers (bundle generation %d, %d root(s))", meta.Source, reply.Generation, len(reply.Roots))}}
	clock := checkResult{Name: "clocks", OK: true}
	if meta.Time.IsZero() {
		clock.Detail = "the reply carries no time"
	} else {
		mid := sent.Add(got.Sub(sent) / 2)
		skew := meta.Time.Sub(mid)
		clock.Detail = fmt.Sprintf("the signer's clock is %s from this one (round trip %s)", skew.Round(time.Millisecond), got.Sub(sent).Round(time.Millisecond))
		if skew > maxClockSkew+got.Sub(sent) || -skew > maxClockSkew+got.Sub(sent) {
			clock.OK, clock.Fix = false, fmt.Sprintf("more than %s apart: run NTP (chrony) on both; certificates are valid from the signer's now", maxClockSkew)
		}
	}
	out = append(out, clock)
	roots := inventory.RootsFromPEM(reply.Roots)
	ca := checkResult{Name: "CA material", OK: len(roots) > 0}
	if len(roots) == 0 {
		ca.Detail, ca.Fix = "the bundle holds no root", "check the signer's CA configuration (-cacerts-dir or its self-signed root)"
	}
	for _, r := range roots {
		left := time.Until(r.NotAfter)
		ca.Detail += fmt.Sprintf("root %s expires in %s; ", short(r.Fingerprint, 16), humanDuration(left))
		if left < rootHorizon && left < r.NotAfter.Sub(r.NotBefore)/5 {
			ca.OK, ca.Fix = false, "rotate the root (meshctl rotate root), or plug in new CA material before it expires"
		}
	}
	ca.Detail = strings.TrimSuffix(ca.Detail, "; ")
	return append(out, ca)
}

// checkFleet reads the fleet's counts (one page of the operator's index): no
// current certificate expired or overdue for renewal, none of the mesh CA's
// under a root the bundle does not hold.
func checkFleet(ctx context.Context, src fleetSource, now time.Time) []checkResult {
	start := time.Now()
	p, err := src.Page(ctx, url.Values{"limit": {"1"}})
	if err != nil {
		return []checkResult{{Name: "certificates", Detail: err.Error(), Fix: "start the operator service (it keeps the inventory), or name it with -operator"}}
	}
	n := p.Counts
	notInBundle := 0
	if p.Trust != nil && len(p.Trust.Roots) > 0 {
		for fp, k := range n.MeshRoots {
			if !slices.ContainsFunc(p.Trust.Roots, func(r inventory.Root) bool { return r.Fingerprint == fp }) {
				notInBundle += k
			}
		}
	}
	r := checkResult{Name: "certificates", OK: true, Detail: fmt.Sprintf("%d current, %d expired, %d renewal(s) overdue, %d under a root not in the bundle (%s, %s)",
		n.Certificates, n.Expired, n.Overdue, notInBundle, src, time.Since(start).Round(time.Millisecond))}
	if p.Loading != nil {
		r.Detail += "; " + strings.TrimPrefix(loadingLine(p), "note: ")
	}
	if n.Expired+n.Overdue+notInBundle > 0 {
		r.OK = false
		first := fmt.Sprintf("%d under a root not in the bundle (meshctl status lists the roots)", notInBundle)
		if late, err := src.Page(ctx, url.Values{"state": {"overdue"}, "limit": {"1"}}); err == nil && len(late.Certs) > 0 {
			c := late.Certs[0]
			first = fmt.Sprintf("%s (%s): %s", orDash(c.Pod), c.SPIFFEID, strings.Join(c.Warnings(now, nil), ", "))
		}
		r.Fix = "first: " + first + "; see meshctl status and the rotator's log (is a rotator running? can the pod reach the signer?)"
	}
	return []checkResult{r}
}
