package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// trustRow is one trust domain the fleet trusts.
type trustRow struct {
	TrustDomain string        `json:"trust_domain"`
	Kind        string        `json:"kind"` // home, federated, removed
	Roots       int           `json:"roots"`
	Source      string        `json:"source"`
	Sequence    uint64        `json:"sequence,omitempty"`
	FetchedAt   time.Time     `json:"fetched_at,omitzero"`
	RefreshHint time.Duration `json:"refresh_hint,omitempty"`
	NextRefresh time.Time     `json:"next_refresh,omitzero"`
}

// runTrust shows the trust domains the fleet trusts: its own (from the signers)
// and every foreign one the signers follow (the last trust.federated of each on
// the event stream), where each bundle came from and when it refreshes.
func runTrust(ctx context.Context, env Env, args []string) error {
	var dir, output string
	var bf busFlags
	fs := flagenv.New("trust", env.Getenv)
	dirFlag(fs, &dir)
	bf.bind(fs)
	bf.bindRole(fs)
	fs.String(&output, "o", "", "text", "output: text or json")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	if output != "text" && output != "json" {
		return fmt.Errorf("-o: %q, want text or json", output)
	}
	st, err := bf.stackFor(dir)
	if err != nil {
		return err
	}
	nc, err := bf.reader(ctx, st, "meshctl trust")
	if err != nil {
		return err
	}
	defer nc.Close()
	home, err := askBundle(ctx, nc)
	if err != nil {
		return err
	}
	feds, err := lastFederated(ctx, nc)
	if err != nil {
		return err
	}
	rows := trustRows(home, feds)
	if output == "json" {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	printTrust(env.Stdout, rows, time.Now())
	return nil
}

// lastFederated reads the newest trust.federated of every foreign domain.
func lastFederated(ctx context.Context, nc *nats.Conn) ([]events.TrustFederated, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	stream, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return nil, fmt.Errorf("event stream: %w", err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(events.TrustFederatedWildcard))
	if err != nil {
		return nil, fmt.Errorf("event stream: %w", err)
	}
	var out []events.TrustFederated
	for subj := range info.State.Subjects {
		raw, err := stream.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			return nil, err
		}
		ev, _, err := events.Decode[events.TrustFederated](&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", subj, err)
		}
		out = append(out, ev)
	}
	return out, nil
}

// trustRows is the home domain first, then the foreign ones by name.
func trustRows(home events.BundleReply, feds []events.TrustFederated) []trustRow {
	rows := []trustRow{{TrustDomain: home.TrustDomain, Kind: "home", Roots: len(home.Roots), Source: "signer CA", Sequence: home.Generation}}
	sort.Slice(feds, func(i, j int) bool { return feds[i].Foreign < feds[j].Foreign })
	for _, f := range feds {
		r := trustRow{TrustDomain: f.Foreign, Kind: "federated", Roots: len(f.Roots), Source: f.Source, Sequence: f.Sequence,
			FetchedAt: f.FetchedAt, RefreshHint: f.RefreshHint}
		if f.Removed {
			r.Kind = "removed"
		} else if !f.FetchedAt.IsZero() {
			r.NextRefresh = f.FetchedAt.Add(f.RefreshHint)
		}
		rows = append(rows, r)
	}
	return rows
}

func printTrust(w io.Writer, rows []trustRow, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TRUST DOMAIN\tKIND\tROOTS\tSOURCE\tSEQUENCE\tFETCHED\tREFRESH HINT\tNEXT REFRESH")
	for _, r := range rows {
		fetched, next, hint := "-", "-", "-"
		if !r.FetchedAt.IsZero() {
			fetched = humanDuration(now.Sub(r.FetchedAt)) + " ago"
		}
		if !r.NextRefresh.IsZero() {
			next = "in " + humanDuration(r.NextRefresh.Sub(now))
		}
		if r.RefreshHint > 0 {
			hint = r.RefreshHint.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\n", r.TrustDomain, r.Kind, r.Roots, orDash(r.Source), r.Sequence, fetched, hint, next)
	}
	tw.Flush()
}
