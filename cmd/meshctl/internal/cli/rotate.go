package cli

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/busrpc"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/nats-io/nats.go"
)

func runRotate(ctx context.Context, env Env, args []string) error {
	var dir string
	var newKey, dryRun bool
	var wait time.Duration
	var bf busFlags
	var ff fleetFlags
	fs := flagenv.New("rotate", env.Getenv)
	dirFlag(fs, &dir)
	bf.bind(fs)
	ff.bind(fs)
	fs.Bool(&newKey, "new-key", "", false, "rotate root: generate a new root key instead of re-signing the current one")
	fs.Bool(&dryRun, "dry-run", "", false, "rotate root: show the plan of the rotation (its phases, when the old root leaves the bundle) without rotating")
	fs.Duration(&wait, "wait", "", 0, "rotate root: follow the fleet (the operator's counts, -operator) until every pod holds the new root, at most this long")
	words, err := parseWords(fs, args)
	if err != nil {
		return err
	}
	usage := fmt.Errorf("%w: meshctl rotate root [-new-key] [-dry-run] [-wait D] | meshctl rotate pod [NAMESPACE/]NAME", errUsage)
	switch {
	case len(words) == 1 && words[0] == "root":
	case len(words) == 2 && words[0] == "pod" && !newKey && !dryRun:
	default:
		return usage
	}
	st, err := bf.stackFor(dir)
	if err != nil {
		return err
	}
	nc, err := bf.connect(ctx, st, "meshctl rotate")
	if err != nil {
		return err
	}
	defer nc.Close()
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if words[0] == "pod" {
		return rotatePod(nc, env, words[1])
	}
	// The rotation under way, as the signers plan it now (a dry run of another
	// is refused until -root-rotate-min-interval has passed: this is not).
	if live, err := askRotation(ctx, nc); err == nil && live != nil && !live.Rotated.IsZero() {
		fmt.Fprintf(env.Stdout, "current: %s\n", rotationPhase(live, time.Now()))
	}
	// The plan first (a dry run: a refusal shows here and nothing changes), then the rotation.
	planned, err := busrpc.RotateRoot(ctx, nc, events.RotateRequest{NewKey: newKey, DryRun: true, Reason: "meshctl rotate root -dry-run"})
	if err != nil {
		return err
	}
	printPlan(env, "plan", planned.Plan)
	if dryRun {
		return nil
	}
	reply, err := busrpc.RotateRoot(ctx, nc, events.RotateRequest{NewKey: newKey, Reason: "meshctl rotate root"})
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "new root sha256 %s; bundle now holds %d root(s)\n", reply.Fingerprint, len(reply.Roots))
	printPlan(env, "now", reply.Plan)
	if p := reply.Plan; p != nil && !p.NewRootLast.Equal(p.Rotated) {
		fmt.Fprintln(env.Stdout, "  (phases 2 and 3 come sooner as the signers see the certificates they sign: meshctl status shows the live plan, -wait follows it)")
	}
	if wait <= 0 {
		return nil
	}
	return followRoot(parent, nc, ff.follower(st, nc), env, reply.Fingerprint, wait)
}

// printPlan shows a rotation's phases (docs/architecture.md, "Root rotation in phases").
func printPlan(env Env, label string, p *events.RotationPlan) {
	if p == nil {
		return
	}
	at := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	fmt.Fprintf(env.Stdout, "%s: phase %d\n", label, p.Phase)
	if p.Rotated.IsZero() {
		fmt.Fprintln(env.Stdout, "  one root, nothing rotating")
		return
	}
	if p.NewRootLast.Equal(p.Rotated) {
		fmt.Fprintf(env.Stdout, "  same key: the new root is the replies' last PEM from %s\n", at(p.Rotated))
	} else {
		fmt.Fprintf(env.Stdout, "  phase 1 from %s: the new key signs, chain [cross-signed new key, old root]\n", at(p.Rotated))
		fmt.Fprintf(env.Stdout, "  phase 2 from %s: the old root stops being the replies' last PEM\n", at(p.NewRootLast))
		fmt.Fprintf(env.Stdout, "  phase 3 from %s: the cross-signed certificate leaves the chain\n", at(p.Settled))
		if p.OldKeyLongest > 0 {
			secs := func(n int64) time.Duration { return time.Duration(n) * time.Second }
			fmt.Fprintf(env.Stdout, "  phase 1 lasts %s: the longest certificate the old key signed lives %s\n",
				p.NewRootLast.Sub(p.Rotated), secs(p.OldKeyLongest))
			fmt.Fprintf(env.Stdout, "  phase 2 lasts %s: the longest certificate signed in phase 1 (so far) lives %s\n",
				p.Settled.Sub(p.NewRootLast), secs(p.Phase1Longest))
			fmt.Fprintln(env.Stdout, "  (each plus a minute of slack; the signer's -max-ttl where nothing was counted)")
		}
	}
	if !p.OldRootLeaves.IsZero() {
		fmt.Fprintf(env.Stdout, "  the old root leaves the bundle at %s\n", at(p.OldRootLeaves))
	}
}

// parseWords parses a command's flags and returns its words: flags may stand
// before, between or after them (rotate -dir D pod ID, inspect demo-0 -dir D).
func parseWords(fs *flagenv.Set, args []string) ([]string, error) {
	fs.AllowArgs()
	var words []string
	rest := args
	for {
		if err := command.Parse(fs, rest); err != nil {
			return nil, err
		}
		rest = fs.FS.Args()
		if len(rest) == 0 {
			return words, nil
		}
		words, rest = append(words, rest[0]), rest[1:]
	}
}

// followRoot reports, from the fleet's counts, how many live pods hold a
// certificate under the new root, until all do or wait runs out. Pods that no
// longer answer (inventory.Cert.Silent: stopped, expired, or deaf to the rotator's
// renewals) and certificates of named signers (whose chains never end at the
// mesh's root) are left out and named, not waited for. Each look costs two pages
// of the operator's index (fleetProgress), whatever the fleet's size.
func followRoot(ctx context.Context, nc *nats.Conn, fleet fleetSource, env Env, fp string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	last, lastOut, lastPhase := "", "", ""
	var err error
	for {
		var p progress
		p, err = fleetProgress(ctx, fleet, fp, time.Now())
		if err == nil {
			if line := p.line(); line != last {
				fmt.Fprintf(env.Stdout, "%s  %s\n", time.Now().Format("15:04:05"), line)
				last = line
			}
			if out := p.leftOut(); out != "" && out != lastOut {
				fmt.Fprintf(env.Stdout, "          left out, not answering: %s\n", out)
				lastOut = out
			}
			if p.held == p.total {
				return nil
			}
		}
		if live, perr := askRotation(ctx, nc); perr == nil && live != nil {
			if line := rotationPhase(live, time.Now()); phaseOnly(line) != lastPhase {
				fmt.Fprintf(env.Stdout, "%s  rotation %s\n", time.Now().Format("15:04:05"), line)
				lastPhase = phaseOnly(line)
			}
		}
		select {
		case <-ctx.Done():
			if last == "" {
				return fmt.Errorf("rotate root -wait: after %s, no inventory: %w", wait, err)
			}
			return fmt.Errorf("rotate root -wait: after %s, %s", wait, last)
		case <-tick.C:
		}
	}
}

// phaseOnly is a rotationPhase line without its countdowns, to print it again
// only when the plan changed.
func phaseOnly(line string) string {
	var b strings.Builder
	skip := false
	for _, r := range line {
		switch {
		case r == '(':
			skip = true
		case r == ')':
			skip = false
		case !skip:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// progress is how far a root rotation has reached the fleet.
type progress struct {
	held, total, named int
	silent             []string // "ns/name (why)", the first few
	more               int      // holders left out beyond those named: an estimate (holders without a pod too, one both silent and expired twice)
}

// leftOutShown is how many of the pods left out a line names.
const leftOutShown = 5

// fleetProgress counts the live pods' certificates under the root fp from the
// fleet's counts (inventory.Counts.LivePodRoots), and names the first pods left
// out: those told to renew again with no new certificate, and those whose
// certificate expired. Two pages of leftOutShown, not the fleet.
func fleetProgress(ctx context.Context, fleet fleetSource, fp string, now time.Time) (progress, error) {
	var p progress
	limit := strconv.Itoa(leftOutShown)
	silent, err := fleet.Page(ctx, url.Values{"state": {"silent"}, "limit": {limit}})
	if err != nil {
		return p, err
	}
	expired, err := fleet.Page(ctx, url.Values{"state": {"current"}, "expiry": {"expired"}, "limit": {limit}})
	if err != nil {
		return p, err
	}
	for root, n := range expired.Counts.LivePodRoots {
		p.total += n
		if root == fp {
			p.held = n
		}
	}
	for _, n := range expired.Counts.Named {
		p.named += n
	}
	for _, pg := range []inventory.Page{silent, expired} {
		left := pg.Total
		for _, c := range pg.Certs {
			if gone, why := c.Silent(now); gone && c.Pod != "" && c.CertSigner == "" && len(p.silent) < leftOutShown {
				p.silent = append(p.silent, c.Pod+" ("+why+")")
				left--
			}
		}
		p.more += max(left, 0)
	}
	return p, nil
}

func (p progress) line() string {
	l := fmt.Sprintf("%d/%d live pod certificate(s) under the new root", p.held, p.total)
	if p.named > 0 {
		l += fmt.Sprintf(" (%d of named signers not counted)", p.named)
	}
	return l
}

func (p progress) leftOut() string {
	if p.more > 0 {
		return fmt.Sprintf("%s and %d more", strings.Join(p.silent, ", "), p.more)
	}
	return strings.Join(p.silent, ", ")
}

func rotatePod(nc *nats.Conn, env Env, arg string) error {
	pod, err := parsePod(arg)
	if err != nil {
		return fmt.Errorf("pod: %w", err)
	}
	subj, err := events.PodRenewSubject(pod)
	if err != nil {
		return err
	}
	// Only the renew command: renew_sent is the rotator's record, not the operator's
	// (the bus refuses it from the admin role); the pod's new cert.issued shows it.
	msg, err := events.NewMsg(subj, "meshctl", events.RenewDue{Pod: pod, Resource: "default", Reason: events.RenewForced})
	if err != nil {
		return err
	}
	if err := nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("publish %s: %w", subj, err)
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	if err := nc.LastError(); err != nil {
		return fmt.Errorf("publish %s: %w", subj, err)
	}
	fmt.Fprintf(env.Stdout, "renew-due sent to pod %s on %s\n", pod, subj)
	return nil
}
