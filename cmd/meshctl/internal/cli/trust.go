package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/busrpc"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// trustRow is one trust domain the fleet trusts, or follows without success.
type trustRow struct {
	TrustDomain string        `json:"trust_domain"`
	Kind        string        `json:"kind"` // home, federated, removed
	Roots       int           `json:"roots"`
	Source      string        `json:"source"`
	Sequence    uint64        `json:"sequence,omitempty"`
	FetchedAt   time.Time     `json:"fetched_at,omitzero"` // last success: fetched and announced
	RefreshHint time.Duration `json:"refresh_hint,omitempty"`
	NextRefresh time.Time     `json:"next_refresh,omitzero"`
	// The answering signer's view of a followed domain (events.FederatedDomain):
	// State is ok, failing or never ("" when no signer reported it, e.g. removed).
	State           string                 `json:"state,omitempty"`
	RootInfo        []events.FederatedRoot `json:"root_info,omitempty"`
	Error           string                 `json:"error,omitempty"`
	ErrorReason     string                 `json:"error_reason,omitempty"`
	LastError       string                 `json:"last_error,omitempty"`
	LastErrorReason string                 `json:"last_error_reason,omitempty"`
	LastErrorAt     time.Time              `json:"last_error_at,omitzero"`
	Errors          map[string]uint64      `json:"errors,omitempty"`
	Signer          string                 `json:"signer,omitempty"` // the replica whose view State is
}

// runTrust shows the trust domains the fleet trusts: its own (from the signers)
// and every foreign one the signers follow (the last trust.federated of each on
// the event stream), where each bundle came from and when it refreshes, and —
// from the answering signer's endorsed status — each followed domain's state:
// last success, last error, roots, including domains never fetched.
func runTrust(ctx context.Context, env Env, args []string) error {
	var dir, output string
	var bf busFlags
	fs := readerFlags("trust", env, &dir, &bf)
	fs.String(&output, "o", "", "text", "output: text or json")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	if output != "text" && output != "json" {
		return fmt.Errorf("-o: %q, want text or json", output)
	}
	nc, err := bf.dialReader(ctx, dir, "meshctl trust")
	if err != nil {
		return err
	}
	defer nc.Close()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	home, err := busrpc.Call[events.BundleReply](rctx, nc, events.SubjectTrustBundle, events.BundleRequest{Federation: true}, "trust bundle request")
	cancel()
	if err != nil {
		return err
	}
	if home.Error != nil {
		return home.Error
	}
	status, err := federationStatus(home)
	if err != nil {
		fmt.Fprintf(env.Stderr, "meshctl trust: the signer's federation status is left out: %v\n", err)
	}
	feds, err := lastFederated(ctx, nc)
	if err != nil {
		return err
	}
	rows := trustRows(home, feds, status)
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

// federationStatus is the federation state a bundle reply carries, once its
// endorsement verifies under the reply's roots (the CA's key vouches for it, as
// for the bundle); nil if the reply carries none (a signer that predates it).
func federationStatus(home events.BundleReply) (*events.FederationStatus, error) {
	if len(home.Federation) == 0 {
		return nil, nil
	}
	roots, err := pki.ParseCertPEMs(home.Roots)
	if err != nil {
		return nil, fmt.Errorf("roots: %w", err)
	}
	msg, err := events.FederationStatusEndorsedBytes(home.TrustDomain, home.Federation)
	if err != nil {
		return nil, err
	}
	var errs []error
	for i, e := range home.FederationEndorsements {
		chain, err := pki.ParseCertPEMs(e.Chain)
		if err == nil {
			err = pki.VerifyEndorsement(roots, msg, e.KeyID, e.Signature, chain)
		}
		if err == nil {
			var st events.FederationStatus
			if err := json.Unmarshal(home.Federation, &st); err != nil {
				return nil, fmt.Errorf("decode: %w", err)
			}
			return &st, nil
		}
		errs = append(errs, fmt.Errorf("endorsement %d: %w", i, err))
	}
	if len(errs) == 0 {
		return nil, errors.New("not endorsed")
	}
	return nil, fmt.Errorf("not endorsed by the CA: %w", errors.Join(errs...))
}

// trustRows is the home domain first, then the foreign ones by name: those
// announced on the stream, and those the signer follows without success so far.
func trustRows(home events.BundleReply, feds []events.TrustFederated, status *events.FederationStatus) []trustRow {
	rows := []trustRow{{TrustDomain: home.TrustDomain, Kind: "home", Roots: len(home.Roots), Source: "signer CA", Sequence: home.Generation}}
	byTD := map[string]*trustRow{}
	var foreign []*trustRow
	for _, f := range feds {
		r := &trustRow{TrustDomain: f.Foreign, Kind: "federated", Roots: len(f.Roots), Source: f.Source, Sequence: f.Sequence,
			FetchedAt: f.FetchedAt, RefreshHint: f.RefreshHint}
		if f.Removed {
			r.Kind = "removed"
		} else if !f.FetchedAt.IsZero() {
			r.NextRefresh = f.FetchedAt.Add(f.RefreshHint)
		}
		byTD[f.Foreign] = r
		foreign = append(foreign, r)
	}
	if status != nil {
		for _, d := range status.Domains {
			r := byTD[d.TrustDomain]
			if r == nil {
				r = &trustRow{TrustDomain: d.TrustDomain}
				byTD[d.TrustDomain] = r
				foreign = append(foreign, r)
			}
			// The signer follows it: its view is the current one.
			r.Kind, r.Source, r.State, r.Signer = "federated", d.Source, d.State, status.Signer
			r.RootInfo, r.Error, r.ErrorReason, r.LastError, r.LastErrorReason, r.LastErrorAt, r.Errors =
				d.RootInfo, d.Error, d.ErrorReason, d.LastError, d.LastErrorReason, d.LastErrorAt, d.Errors
			if d.LastSuccess.After(r.FetchedAt) {
				r.Roots, r.Sequence, r.FetchedAt, r.RefreshHint = d.Roots, d.Sequence, d.LastSuccess, d.RefreshHint
			}
			if !d.NextRefresh.IsZero() {
				r.NextRefresh = d.NextRefresh
			}
		}
	}
	sort.Slice(foreign, func(i, j int) bool { return foreign[i].TrustDomain < foreign[j].TrustDomain })
	for _, r := range foreign {
		rows = append(rows, *r)
	}
	return rows
}

func printTrust(w io.Writer, rows []trustRow, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TRUST DOMAIN\tKIND\tSTATE\tROOTS\tSOURCE\tSEQUENCE\tFETCHED\tREFRESH HINT\tNEXT REFRESH")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\n", r.TrustDomain, r.Kind, orDash(r.State), r.Roots, orDash(r.Source), r.Sequence, fetched, hint, next)
	}
	tw.Flush()
	// Below the table, what a row cannot hold: each followed domain's errors
	// and roots, as the answering signer sees them.
	for _, r := range rows {
		if r.Signer == "" {
			continue
		}
		if r.Error != "" {
			since := ""
			if !r.LastErrorAt.IsZero() {
				since = ", last " + humanDuration(now.Sub(r.LastErrorAt)) + " ago"
			}
			what := "failing"
			if r.State == "never" {
				what = "never fetched"
			}
			fmt.Fprintf(w, "\n%s %s (signer %s, %d failed refreshes%s): %s: %s\n", r.TrustDomain, what, r.Signer, sumErrors(r.Errors), since, r.ErrorReason, r.Error)
		} else if r.LastError != "" {
			fmt.Fprintf(w, "\n%s ok; last error %s ago: %s: %s\n", r.TrustDomain, humanDuration(now.Sub(r.LastErrorAt)), r.LastErrorReason, r.LastError)
		}
		for _, root := range r.RootInfo {
			fmt.Fprintf(w, "  %s root sha256:%s %s, expires %s (%s)\n", r.TrustDomain, root.SHA256, orDash(root.Subject),
				root.NotAfter.UTC().Format(time.RFC3339), expiresIn(root.NotAfter, now))
		}
	}
}

func sumErrors(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

func expiresIn(t, now time.Time) string {
	if !t.After(now) {
		return "EXPIRED " + humanDuration(now.Sub(t)) + " ago"
	}
	return "in " + humanDuration(t.Sub(now))
}
