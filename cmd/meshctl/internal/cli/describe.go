package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// runDescribe is one pod in one view (istioctl x describe): its identity and
// certificates from the inventory, the roots they chain to, its xDS streams and its
// recent events.
func runDescribe(ctx context.Context, env Env, args []string) error {
	var dir string
	var recent int
	var bf busFlags
	var ff fleetFlags
	fs := readerFlags("describe", env, &dir, &bf)
	ff.bind(fs)
	fs.Int(&recent, "events", "", 10, "how many of the pod's recent events to show")
	words, err := parseWords(fs, args)
	if err != nil {
		return err
	}
	if len(words) != 2 || words[0] != "pod" {
		return fmt.Errorf("%w: meshctl describe pod [NAMESPACE/]NAME", errUsage)
	}
	pod, err := parsePod(words[1])
	if err != nil {
		return fmt.Errorf("pod: %w", err)
	}
	st, err := bf.stackFor(dir)
	if err != nil {
		return err
	}
	nc, err := bf.reader(ctx, st, "meshctl describe")
	if err != nil {
		return err
	}
	defer nc.Close()
	// The pod's records: one page of the index, by holder (a prefix: the pods
	// whose names extend this one's are left out here).
	p, err := ff.source(st, nc).Page(ctx, url.Values{"pod": {pod.String()}, "limit": {"1000"}, "bench": {"1"}})
	if err != nil {
		return err
	}
	var certs []inventory.Cert
	for _, c := range p.Certs {
		if c.Pod == pod.String() {
			certs = append(certs, c)
		}
	}
	x, last, err := podHistory(ctx, nc, pod, recent)
	if err != nil {
		return err
	}
	if len(certs) == 0 && len(x.streams) == 0 && len(last) == 0 {
		return fmt.Errorf("pod %s: not in the inventory and no events", pod)
	}
	if line := loadingLine(p); line != "" {
		fmt.Fprintln(env.Stderr, line)
	}
	describePod(env.Stdout, pod, certs, p.Trust, x.list(false, pod.String()), last, time.Now())
	return nil
}

// caRecent bounds how much of the CA's history describe reads for the pod's
// cert.issued and renewals (the newest events only: the inventory holds the rest).
const caRecent = 2000

// podHistory reads the events the pod published — on its own subjects, so that
// the bus hands over that pod's and no other's, however large the fleet — for
// its xDS state and its recent events, with its events among the newest caRecent
// of the CA's history (cert.issued, renewals).
func podHistory(ctx context.Context, nc *nats.Conn, pod events.PodRef, recent int) (*xdsTypes, []auditlog.Entry, error) {
	x := newXDSTypes()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, err
	}
	st, err := js.Stream(ctx, events.StreamPodEvents)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return x, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("pod events: %w", err)
	}
	subject, err := events.PodEventsOf(pod)
	if err != nil {
		return nil, nil, err
	}
	var last []auditlog.Entry
	err = auditlog.Scan(ctx, nc, st, subject, 1, 0, func(m *jetstream.RawStreamMsg) error {
		p, meta, err := events.DecodeAny(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
		e := auditlog.Entry{Seq: m.Sequence, Stream: events.StreamPodEvents, Subject: m.Subject, Meta: meta, Payload: p, Err: err}
		if e.Err == nil {
			x.add(e)
		}
		last = append(last, e)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("pod events: %w", err)
	}
	l, err := auditlog.Open(ctx, nc)
	if err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	for _, e := range last {
		seen[e.Meta.ID] = true
	}
	err = l.Read(ctx, auditlog.Filter{Pod: pod.String(), Last: caRecent}, false, nil, func(e auditlog.Entry) error {
		if e.Meta.ID == "" || !seen[e.Meta.ID] {
			last = append(last, e)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	slices.SortStableFunc(last, func(a, b auditlog.Entry) int { return a.Meta.Time.Compare(b.Meta.Time) })
	return x, last[max(len(last)-max(recent, 0), 0):], nil
}

func describePod(w io.Writer, pod events.PodRef, certs []inventory.Cert, trust *inventory.Trust, streams []*adsStream, last []auditlog.Entry, now time.Time) {
	fmt.Fprintf(w, "Pod:          %s\n", pod)
	if len(certs) == 0 {
		fmt.Fprintln(w, "Certificate:  none in the inventory")
	}
	for _, c := range certs {
		state := "current"
		if c.Down {
			state = "pod said it stopped " + humanDuration(now.Sub(c.DownAt)) + " ago"
		}
		if warn := c.Warnings(now, trust); len(warn) > 0 {
			state += "; " + strings.Join(warn, ", ")
		}
		fmt.Fprintf(w, "Identity:     %s\n", c.SPIFFEID)
		fmt.Fprintf(w, "Certificate:  %s (resource %s), serial %s, %s\n", c.KeyAlgorithm, c.Resource, c.Serial, state)
		fmt.Fprintf(w, "  valid       %s to %s (expires in %s; renews by %s)\n", c.NotBefore.Local().Format(time.DateTime),
			c.NotAfter.Local().Format(time.DateTime), humanDuration(c.NotAfter.Sub(now)), c.RenewsBy().Local().Format(time.TimeOnly))
		signer := c.Signer
		if c.CertSigner != "" {
			signer += ", named signer " + c.CertSigner
		}
		fmt.Fprintf(w, "  issued by   %s, %d renewal(s) before it, last renewal %s\n", signer, c.Renewals, orDash(c.LastRenewal))
		fmt.Fprintf(w, "  served      to %d SDS stream(s), version %s\n", c.Streams, orDash(c.Version))
		root := short(c.Root, 16)
		switch {
		case c.CertSigner != "":
			root += " (the named signer's own root)"
		case trust != nil && slices.ContainsFunc(trust.Roots, func(r inventory.Root) bool { return r.Fingerprint == c.Root }):
			root += " (in the trust bundle)"
		case trust != nil:
			root += " (NOT in the trust bundle)"
		}
		fmt.Fprintf(w, "  root        %s\n", root)
	}
	if trust != nil {
		fmt.Fprintf(w, "Roots:        trust bundle generation %d of %s\n", trust.Generation, trust.TrustDomain)
		for _, r := range trust.Roots {
			fmt.Fprintf(w, "  %s  %s  expires in %s\n", short(r.Fingerprint, 16), r.Subject, humanDuration(r.NotAfter.Sub(now)))
		}
	}
	if len(streams) == 0 {
		fmt.Fprintln(w, "xDS:          no open ADS stream")
	} else {
		fmt.Fprintln(w, "xDS:")
		for _, s := range streams {
			fmt.Fprintf(w, "  stream %s (%s) to %s, connected %s ago\n", s.ID, s.Mode, s.Upstream, humanDuration(now.Sub(s.Connected)))
			urls := make([]string, 0, len(s.Types))
			for u := range s.Types {
				urls = append(urls, u)
			}
			slices.Sort(urls)
			for _, u := range urls {
				fmt.Fprintf(w, "    %-4s %s\n", shortType(u), s.Types[u].cell(now))
			}
		}
	}
	fmt.Fprintf(w, "Recent events (%d):\n", len(last))
	for _, e := range last {
		fmt.Fprintf(w, "  %s\n", e.Line(now))
	}
}
