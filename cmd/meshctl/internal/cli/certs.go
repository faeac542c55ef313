package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
)

func runCerts(ctx context.Context, env Env, args []string) error {
	var dir, output string
	var withBench bool
	var bf busFlags
	fs := readerFlags("certs", env, &dir, &bf)
	fs.String(&output, "o", "", "text", "output: text, wide or json")
	fs.Bool(&withBench, "bench", "", false, "also list meshctl bench's certificates (namespace "+events.BenchNamespace+"), left out by default")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	if output != "text" && output != "wide" && output != "json" {
		return fmt.Errorf("-o: %q, want text, wide or json", output)
	}
	snap, err := readInventory(ctx, &bf, dir, "meshctl certs")
	if err != nil {
		return err
	}
	if !withBench {
		var n int
		if snap, n = snap.WithoutBench(); n > 0 {
			fmt.Fprintf(env.Stderr, "meshctl: %d certificate(s) of meshctl bench (namespace %s) left out; -bench lists them\n", n, events.BenchNamespace)
		}
	}
	if output == "json" {
		certs := make([]inventory.Cert, len(snap.Certs))
		for i, c := range snap.Certs {
			c.Chain = nil // inspect shows chains
			certs[i] = c
		}
		if line := snap.SkippedLine(); line != "" {
			fmt.Fprintln(env.Stderr, line) // stdout stays the JSON array
		}
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(certs)
	}
	printCerts(env.Stdout, snap, output == "wide", time.Now())
	return nil
}

// readInventory connects as a reader and loads the inventory.
func readInventory(ctx context.Context, bf *busFlags, dir, name string) (inventory.Snapshot, error) {
	nc, err := bf.dialReader(ctx, dir, name)
	if err != nil {
		return inventory.Snapshot{}, err
	}
	defer nc.Close()
	return inventory.Read(ctx, nc)
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
