package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
)

// runDescribe is one pod in one view (istioctl x describe): its identity and
// certificates from the inventory, the roots they chain to, its xDS streams and its
// recent events.
func runDescribe(ctx context.Context, env Env, args []string) error {
	var dir string
	var recent int
	var bf busFlags
	fs := readerFlags("describe", env, &dir, &bf)
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
	nc, err := bf.dialReader(ctx, dir, "meshctl describe")
	if err != nil {
		return err
	}
	defer nc.Close()
	snap, err := inventory.Read(ctx, nc)
	if err != nil {
		return err
	}
	l, err := auditlog.Open(ctx, nc)
	if err != nil {
		return err
	}
	// One read of the pod's history: its xDS state and its last events.
	x := newXDSTypes()
	var last []auditlog.Entry
	err = l.Read(ctx, auditlog.Filter{Pod: pod.String()}, false, nil, func(e auditlog.Entry) error {
		if e.Err == nil {
			x.add(e)
		}
		last = append(last, e)
		if len(last) > max(recent, 0) {
			last = last[1:]
		}
		return nil
	})
	if err != nil {
		return err
	}
	certs := snap.Find(pod.String())
	if len(certs) == 0 && len(x.streams) == 0 && len(last) == 0 {
		return fmt.Errorf("pod %s: not in the inventory and no events", pod)
	}
	describePod(env.Stdout, pod, certs, snap.Trust, x.list(false, pod.String()), last, time.Now())
	return nil
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
