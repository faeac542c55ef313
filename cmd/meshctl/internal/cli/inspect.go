package cli

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/busrpc"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/pkg/inventory/fleetindex"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats.go"
)

func runInspect(ctx context.Context, env Env, args []string) error {
	var dir string
	var bf busFlags
	var ff fleetFlags
	fs := readerFlags("inspect", env, &dir, &bf)
	ff.bind(fs)
	words, err := parseWords(fs, args)
	if err != nil {
		return err
	}
	if len(words) != 1 {
		return fmt.Errorf("%w: meshctl inspect <pod | serial | PEM file>", errUsage)
	}
	what := words[0]
	st, err := bf.stackFor(dir)
	if err != nil {
		return err
	}
	nc, err := bf.reader(ctx, st, "meshctl inspect")
	if err != nil {
		return err
	}
	defer nc.Close()
	var chains [][]*x509.Certificate
	var records []inventory.Cert
	var snap inventory.Snapshot
	if data, ferr := os.ReadFile(what); ferr == nil {
		cs, err := pki.ParseCertsPEM(data)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		chains = append(chains, cs)
		records = append(records, inventory.Cert{})
	} else {
		var invErr error
		snap, invErr = findRecords(ctx, nc, ff.source(st, nc), what)
		if invErr != nil {
			return fmt.Errorf("%s is no file, and the inventory cannot be read: %w", what, invErr)
		}
		if line := snap.SkippedLine(); line != "" {
			fmt.Fprintln(env.Stderr, line)
		}
		for _, c := range snap.Certs {
			cs, err := pki.ParseCertPEMs(c.Chain)
			if err != nil || len(cs) == 0 {
				return fmt.Errorf("inventory record of %s/%s has no readable chain: %v", c.Pod, c.Resource, err)
			}
			chains = append(chains, cs)
			records = append(records, c)
		}
		if len(chains) == 0 {
			return fmt.Errorf("%q: no such file, and no pod or serial (at least 6 hex digits) of that name in the inventory", what)
		}
	}
	roots, gen, err := currentBundle(ctx, nc, snap)
	if err != nil {
		return err
	}
	bad := 0
	for i, cs := range chains {
		if i > 0 {
			fmt.Fprintln(env.Stdout)
		}
		if !describeChain(env.Stdout, cs, records[i], roots, gen, time.Now()) {
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d certificate(s) do not verify against the current bundle", bad)
	}
	return nil
}

// findRecords is the inventory's records, chains included, of the pod named what
// and of the certificates whose serial starts with what (at least 6 hex digits),
// with the trust record: the pod's read by key, a serial looked up in one page
// of the fleet's index (the operator's, else one built from the bucket read
// whole: -operator), then its holder's records read by key. It never reads the
// fleet when the operator answers.
func findRecords(ctx context.Context, nc *nats.Conn, fleet fleetSource, what string) (inventory.Snapshot, error) {
	keys := []string{inventory.TrustKey}
	if pod, err := events.ParsePodRef(what); err == nil {
		keys = append(keys, inventory.PodKeys(pod))
	}
	serial := strings.ToLower(what)
	if isSerialPrefix(serial) {
		p, err := fleet.Page(ctx, url.Values{"serial": {serial}, "bench": {"1"}, "limit": {strconv.Itoa(fleetindex.MaxLimit)}})
		if err != nil {
			return inventory.Snapshot{}, err
		}
		for _, c := range p.Certs {
			keys = append(keys, inventory.KeyOfCert(c))
		}
	}
	snap, err := inventory.ReadKeys(ctx, nc, keys...)
	if err != nil {
		return snap, err
	}
	snap.Certs = snap.Find(what)
	return snap, nil
}

// isSerialPrefix reports whether s (lower case) may be the start of a serial as
// inspect takes one: at least 6 hex digits.
func isSerialPrefix(s string) bool {
	return len(s) >= 6 && len(s) <= 64 && strings.Trim(s, "0123456789abcdef") == ""
}

// currentBundle is the trust bundle: asked of the signers, else the inventory's
// trust record (snap's, else read by its key).
func currentBundle(ctx context.Context, nc *nats.Conn, snap inventory.Snapshot) ([]*x509.Certificate, uint64, error) {
	if reply, err := askBundle(ctx, nc); err == nil {
		cs, err := pki.ParseCertPEMs(reply.Roots)
		return cs, reply.Generation, err
	}
	if snap.Trust == nil {
		snap, _ = inventory.ReadKeys(ctx, nc, inventory.TrustKey)
	}
	if snap.Trust == nil {
		return nil, 0, errors.New("no trust bundle: the signers do not answer and the inventory has none")
	}
	var pems []string
	for _, r := range snap.Trust.Roots {
		pems = append(pems, r.PEM)
	}
	cs, err := pki.ParseCertPEMs(pems)
	return cs, snap.Trust.Generation, err
}

// askBundle requests the trust bundle from the signers (2 s).
func askBundle(ctx context.Context, nc *nats.Conn) (events.BundleReply, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	reply, err := busrpc.Call[events.BundleReply](rctx, nc, events.SubjectTrustBundle, events.BundleRequest{}, "trust bundle request")
	if err != nil {
		return reply, err
	}
	if reply.Error != nil {
		return reply, reply.Error
	}
	return reply, nil
}

// describeChain prints a chain (leaf first) and whether it verifies against roots;
// it reports that.
func describeChain(w io.Writer, cs []*x509.Certificate, rec inventory.Cert, roots []*x509.Certificate, gen uint64, now time.Time) bool {
	leaf := cs[0]
	if rec.Pod != "" {
		fmt.Fprintf(w, "pod         %s (resource %s, issued by %s at %s)\n", rec.Pod, rec.Resource, rec.Signer, rec.Issued.Local().Format(time.RFC3339))
	}
	fmt.Fprintf(w, "subject     %s\n", orDash(leaf.Subject.String()))
	for _, u := range leaf.URIs {
		fmt.Fprintf(w, "SPIFFE ID   %s\n", u)
	}
	fmt.Fprintf(w, "serial      %s\n", pki.SerialHex(leaf))
	alg, _ := pki.AlgOf(leaf.PublicKey)
	fmt.Fprintf(w, "key         %s\n", orDash(string(alg)))
	fmt.Fprintf(w, "validity    %s to %s (%s)\n", leaf.NotBefore.Local().Format(time.RFC3339), leaf.NotAfter.Local().Format(time.RFC3339), validity(leaf, now))
	fmt.Fprintf(w, "chain\n")
	for i, c := range cs {
		role := "leaf"
		if i > 0 {
			role = "CA"
		}
		fmt.Fprintf(w, "  %d %-4s  %s  issuer %s  until %s  sha256 %s\n", i, role, orDash(c.Subject.String()), c.Issuer, c.NotAfter.Local().Format("2006-01-02"), pki.Fingerprint(c)[:16])
	}
	pool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	for _, c := range cs[1:] {
		inter.AddCert(c)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		fmt.Fprintf(w, "verifies    NO, against the current bundle (generation %d, %d root(s)): %v\n", gen, len(roots), err)
		return false
	}
	root := chains[0][len(chains[0])-1]
	fmt.Fprintf(w, "verifies    yes, against the current bundle (generation %d): root %s, sha256 %s, expires in %s\n",
		gen, root.Subject, pki.Fingerprint(root)[:16], humanDuration(root.NotAfter.Sub(now)))
	return true
}

func validity(c *x509.Certificate, now time.Time) string {
	switch {
	case now.Before(c.NotBefore):
		return "not valid yet, starts in " + humanDuration(c.NotBefore.Sub(now))
	case now.After(c.NotAfter):
		return "EXPIRED " + humanDuration(now.Sub(c.NotAfter)) + " ago"
	}
	return fmt.Sprintf("%s left of %s", humanDuration(c.NotAfter.Sub(now)), humanDuration(c.NotAfter.Sub(c.NotBefore)))
}
