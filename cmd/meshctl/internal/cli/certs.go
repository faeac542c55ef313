package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/pkg/inventory/fleetindex"
	"github.com/nats-io/nats.go"
)

// runCerts lists one page of the inventory, filtered and sorted as the
// operator's API does it (-ns, -pod, -root, -expiry, -state, -sort, -order,
// -limit, -offset).
func runCerts(ctx context.Context, env Env, args []string) error {
	var dir, output string
	var withBench bool
	var bf busFlags
	var ff fleetFlags
	var pf pageFlags
	fs := readerFlags("certs", env, &dir, &bf)
	ff.bind(fs)
	pf.bind(fs)
	fs.String(&output, "o", "", "text", "output: text, wide or json")
	fs.Bool(&withBench, "bench", "", false, "also list meshctl bench's certificates (namespace "+events.BenchNamespace+"), left out by default")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	if output != "text" && output != "wide" && output != "json" {
		return fmt.Errorf("-o: %q, want text, wide or json", output)
	}
	v := pf.values()
	if withBench {
		v.Set("bench", "1")
	}
	if _, err := fleetindex.ParseQuery(v); err != nil {
		return err // refused here, with the flags' names, before any connection
	}
	p, err := readPage(ctx, &bf, &ff, dir, "meshctl certs", v)
	if err != nil {
		return err
	}
	if line := loadingLine(p); line != "" {
		fmt.Fprintln(env.Stderr, line)
	}
	if !withBench && p.BenchHidden > 0 {
		fmt.Fprintf(env.Stderr, "meshctl: %d certificate(s) of meshctl bench (namespace %s) left out; -bench lists them\n", p.BenchHidden, events.BenchNamespace)
	}
	snap := inventory.Snapshot{Certs: p.Certs, Trust: p.Trust, Skipped: p.Skipped}
	if output == "json" {
		if line := snap.SkippedLine(); line != "" {
			fmt.Fprintln(env.Stderr, line) // stdout stays the JSON array
		}
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(p.Certs)
	}
	printCerts(env.Stdout, snap, output == "wide", time.Now())
	if p.Total > len(p.Certs) {
		fmt.Fprintf(env.Stdout, "%d–%d of %d (-offset %d for the next page)\n", p.Offset+min(1, len(p.Certs)), p.Offset+len(p.Certs), p.Total, p.Offset+p.Limit)
	}
	return nil
}

// pageFlags are the API's filter, order and cut, as flags.
type pageFlags struct {
	ns, pod, root, expiry, state, sort, order string
	limit, offset                             int
}

func (f *pageFlags) bind(fs *flagenv.Set) {
	fs.String(&f.ns, "ns", "", "", "only this namespace")
	fs.String(&f.pod, "pod", "", "", "only pods whose name (or NAMESPACE/NAME) starts with this")
	fs.String(&f.root, "root", "", "", "only certificates under a root whose fingerprint starts with this")
	fs.String(&f.expiry, "expiry", "", "", "only certificates expired (expired) or expiring within a duration (1h)")
	fs.String(&f.state, "state", "", "", "only current, down, overdue (renewal overdue or expired) or silent (told to renew again, no new certificate) ones")
	fs.String(&f.sort, "sort", "", "expiry", "order: expiry, pod, namespace or root")
	fs.String(&f.order, "order", "", "asc", "asc or desc")
	fs.Int(&f.limit, "limit", "", fleetindex.DefaultLimit, fmt.Sprintf("certificates on the page (1 to %d)", fleetindex.MaxLimit))
	fs.Int(&f.offset, "offset", "", 0, "certificates to skip (the next page: -offset LIMIT)")
}

func (f *pageFlags) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"ns": f.ns, "pod": f.pod, "root": f.root, "expiry": f.expiry, "state": f.state,
		"sort": f.sort, "order": f.order, "limit": strconv.Itoa(f.limit), "offset": strconv.Itoa(f.offset)} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// readPage connects as a reader and reads one page: from the operator's API when
// its address is known, else from the bucket read whole.
func readPage(ctx context.Context, bf *busFlags, ff *fleetFlags, dir, name string, v url.Values) (inventory.Page, error) {
	st, err := bf.stackFor(dir)
	if err != nil {
		return inventory.Page{}, err
	}
	var nc *nats.Conn
	if ff.operator == "" && (st == nil || st.Dashboard == "") {
		if nc, err = bf.reader(ctx, st, name); err != nil {
			return inventory.Page{}, err
		}
		defer nc.Close()
	}
	return ff.source(st, nc).Page(ctx, v)
}

// printCerts is the inventory as a table, soonest expiry first.
func printCerts(w io.Writer, snap inventory.Snapshot, wide bool, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "POD\tSPIFFE ID\tSERIAL\tEXPIRES IN\tWARNING"
	if wide {
		head += "\tRESOURCE\tNOT BEFORE\tNOT AFTER\tSIGNER\tROOT\tSDS STREAMS\tRENEWALS\tLAST RENEWAL"
	}
	fmt.Fprintln(tw, head)
	for _, c := range snap.Certs {
		warn := strings.Join(c.Warnings(now, snap.Trust), ", ")
		if c.Down {
			warn = "pod down"
		}
		if warn == "" {
			warn = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s", orDash(c.Pod), c.SPIFFEID, short(c.Serial, 16), humanDuration(c.NotAfter.Sub(now)), warn)
		if wide {
			fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s", c.Resource, c.NotBefore.Local().Format(time.RFC3339),
				c.NotAfter.Local().Format(time.RFC3339), c.Signer, short(c.Root, 12), c.Streams, c.Renewals, orDash(c.LastRenewal))
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	if len(snap.Certs) == 0 {
		fmt.Fprintln(w, "(no certificates in the inventory yet)")
	}
	if line := snap.SkippedLine(); line != "" {
		fmt.Fprintln(w, line)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
