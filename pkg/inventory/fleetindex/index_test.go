package fleetindex

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
)

// record is a random certificate record of holder i.
func record(r *rand.Rand, i int, now time.Time) (string, inventory.Cert) {
	namespaces := []string{"a", "a-b", "perf", "web", events.BenchNamespace}
	ns := namespaces[r.IntN(len(namespaces))]
	c := inventory.Cert{Resource: "default", Serial: fmt.Sprintf("%x", r.Uint64()), Signer: "signer-0",
		Root: []string{"aaaa01", "aaaa02", "bbbb01"}[r.IntN(3)], KeyAlgorithm: "EC-P256",
		NotBefore: now.Add(-time.Duration(r.IntN(120)) * time.Minute), Down: r.IntN(10) == 0}
	c.NotAfter = c.NotBefore.Add(time.Duration(1+r.IntN(180)) * time.Minute)
	c.SPIFFEID = "spiffe://td/ns/" + ns + "/sa/s" + fmt.Sprint(i%7)
	if r.IntN(8) == 0 {
		c.LastRenewal, c.RenewSent, c.Issued = events.RenewRetry, now, now.Add(-time.Minute)
	}
	if r.IntN(20) == 0 { // no pod: an Istio agent
		return "id." + c.SPIFFEID + fmt.Sprint(i), c
	}
	c.Pod = fmt.Sprintf("%s/web-%d", ns, i)
	return fmt.Sprintf("pod.%s.%x.64", ns, i), c
}

// TestPagesAgreeWithAScan: whatever the changes and the query, a page is what
// filtering and sorting every record would give (the runs the index picks hold
// every match, in order), and the counts are those of every record.
func TestPagesAgreeWithAScan(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	now := time.Now()
	ix := New()
	held := map[string]inventory.Cert{}
	queries := []Query{{}, {Namespace: "a"}, {Namespace: "a", Sort: "pod"}, {Namespace: "perf", Sort: "root", Desc: true},
		{Pod: "web-1"}, {Pod: "a/web-1"}, {Pod: "a-b/"}, {Pod: "spiffe://td/ns/a/"}, {Pod: "web/"}, {Root: "aaaa"}, {Root: "aaaa02", Within: time.Hour},
		{Root: "bbbb01", Sort: "pod"}, {Within: -1}, {Within: 30 * time.Minute, Sort: "namespace"}, {State: "overdue"},
		{State: "silent", Sort: "pod"}, {State: "down", Namespace: "web"}, {State: "current", Bench: true, Sort: "root"},
		{Bench: true, Namespace: events.BenchNamespace}, {Sort: "pod", Offset: 40}, {Namespace: "a", Within: time.Hour, Desc: true},
		{Serial: "a1"}, {Serial: "f", Bench: true, Sort: "pod"}, {Serial: "3", State: "current", Namespace: "web"}}
	for round := range 15 {
		for range 50 + r.IntN(200) {
			i := r.IntN(600)
			key, c := record(r, i, now)
			if r.IntN(6) == 0 {
				ix.Delete(key)
				delete(held, key)
				continue
			}
			b, _ := json.Marshal(c)
			ix.Put(key, b)
			held[key] = c
		}
		if round%3 == 0 {
			ix.Flush() // some rounds merge the changes at once, others at the page
		}
		for _, q := range queries {
			q.Limit = 1000
			q.Sort = cmpOr(q.Sort, "expiry")
			got := ix.Page(q, now)
			total, want := scan(held, q, now)
			if got.Total != total || !slices.EqualFunc(got.Certs, want, func(a, b inventory.Cert) bool { return a.Serial == b.Serial }) {
				t.Fatalf("round %d %+v: %d certificates, want %d\ngot  %v\nwant %v", round, q, got.Total, total, serials(got.Certs), serials(want))
			}
		}
		if got, want := ix.Counts(now), countAll(held, now); got.Certificates != want.Certificates || got.Down != want.Down ||
			got.Expired != want.Expired || got.ExpireIn1h != want.ExpireIn1h || got.Overdue != want.Overdue || got.Silent != want.Silent || got.RenewIn1h != want.RenewIn1h ||
			got.Bench != want.Bench || got.Pods != want.Pods || !maps.Equal(got.LivePodRoots, want.LivePodRoots) {
			t.Fatalf("round %d counts %+v, want %+v", round, got, want)
		}
	}
}

func cmpOr(a, b string) string {
	if a == "" {
		return b
	}
	return a
}

func serials(cs []inventory.Cert) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Pod + ":" + c.Serial[:4]
	}
	return out
}

// scan is the page of q over every record, the long way.
func scan(held map[string]inventory.Cert, q Query, now time.Time) (int, []inventory.Cert) {
	var es []*entry
	for k, c := range held {
		if e := newEntry(k, c); q.match(e, now) {
			es = append(es, e)
		}
	}
	set := newOrderSet(func(*entry) bool { return true })
	slices.SortFunc(es, set.bySort(q.Sort).cmp)
	if q.Desc {
		slices.Reverse(es)
	}
	total := len(es)
	es = es[min(q.Offset, len(es)):]
	es = es[:min(q.Limit, len(es))]
	out := make([]inventory.Cert, len(es))
	for i, e := range es {
		out[i] = e.c
	}
	return total, out
}

func countAll(held map[string]inventory.Cert, now time.Time) inventory.Counts {
	c := inventory.Counts{LivePodRoots: map[string]int{}}
	pods := map[string]bool{}
	for k, cert := range held {
		e := newEntry(k, cert)
		switch {
		case e.bench:
			c.Bench++
		case cert.Down:
			c.Down++
		default:
			c.Certificates++
			if cert.Pod != "" {
				pods[cert.Pod] = true
			}
			// What rotate root -wait waits for (cli.rootProgress before it asked the operator).
			if silent, _ := cert.Silent(now); cert.Pod != "" && cert.CertSigner == "" && !silent {
				c.LivePodRoots[cert.Root]++
			}
			switch w := cert.Warnings(now, nil); {
			case len(w) > 0 && w[0] == "expired":
				c.Expired++
			case len(w) > 0 && w[0] == "renewal overdue":
				c.Overdue++
			}
			// Silent at any time before its expiry: told to renew again, no new certificate.
			if silent, why := cert.Silent(cert.NotBefore); silent && strings.HasPrefix(why, "told to renew") {
				c.Silent++
			}
			if now.Before(cert.NotAfter) && cert.NotAfter.Before(now.Add(time.Hour)) {
				c.ExpireIn1h++
			}
			if now.Before(cert.NotAfter) && cert.RenewsBy().Before(now.Add(time.Hour)) {
				c.RenewIn1h++
			}
		}
	}
	c.Pods = len(pods)
	return c
}

// A serial filter is hex, at least 6 digits (as meshctl inspect takes one), any case;
// anything else is refused, naming the parameter.
func TestParseQuerySerial(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{{"A1B2C3", "a1b2c3", true}, {"0123456789abcdef0123", "0123456789abcdef0123", true}, {"a1b2c", "", false}, {"a1b2cg", "", false}, {"a1b2c3.", "", false}} {
		q, err := ParseQuery(map[string][]string{"serial": {tc.in}})
		if ok := err == nil; ok != tc.ok || ok && q.Serial != tc.want || !ok && !strings.Contains(err.Error(), "serial:") {
			t.Errorf("serial %q: %+v, %v", tc.in, q.Serial, err)
		}
	}
}
