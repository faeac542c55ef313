package dashboard

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/inventory"
)

// Paging bounds of /api/inventory: a page is what a person reads, never the fleet.
const (
	defaultLimit = 100
	maxLimit     = 1000
)

// query is one /api/inventory request: a filter, an order and a page. The
// inventory is filtered, sorted and cut on the server, so that a fleet of 100,000
// certificates costs the page one screenful.
type query struct {
	namespace string        // exact namespace of the holder
	pod       string        // substring of "<ns>/<name>", or of the SPIFFE ID when there is no pod
	root      string        // prefix of the root's fingerprint
	within    time.Duration // expiring within this (0: any); negative: expired only
	sort      string        // expiry (default), pod, namespace, root
	desc      bool
	offset    int
	limit     int
	bench     bool // include meshctl bench's certificates
}

var sortKeys = []string{"expiry", "pod", "namespace", "root"}

// parseQuery reads a request's parameters; bad input is an error naming the
// parameter, and nothing is served.
func parseQuery(v url.Values) (query, error) {
	q := query{namespace: v.Get("ns"), pod: v.Get("pod"), root: strings.ToLower(v.Get("root")),
		sort: cmp.Or(v.Get("sort"), "expiry"), desc: v.Get("order") == "desc", bench: v.Get("bench") == "1", limit: defaultLimit}
	var errs []error
	if !slices.Contains(sortKeys, q.sort) {
		errs = append(errs, fmt.Errorf("sort: %q, want one of %s", q.sort, strings.Join(sortKeys, ", ")))
	}
	if o := v.Get("order"); o != "" && o != "asc" && o != "desc" {
		errs = append(errs, fmt.Errorf("order: %q, want asc or desc", o))
	}
	num := func(name string, dst *int, lo, hi int) {
		s := v.Get(name)
		if s == "" {
			return
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < lo || n > hi {
			errs = append(errs, fmt.Errorf("%s: %q, want %d to %d", name, s, lo, hi))
			return
		}
		*dst = n
	}
	num("offset", &q.offset, 0, 1<<30)
	num("limit", &q.limit, 1, maxLimit)
	switch e := v.Get("expiry"); e {
	case "":
	case "expired":
		q.within = -1
	default:
		d, err := time.ParseDuration(e)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("expiry: %q, want expired or a positive duration (1h)", e))
		}
		q.within = d
	}
	for name, s := range map[string]string{"ns": q.namespace, "pod": q.pod, "root": q.root} {
		if len(s) > 253 {
			errs = append(errs, fmt.Errorf("%s: longer than 253 bytes", name))
		}
	}
	return q, errors.Join(errs...)
}

func (q query) match(c *inventory.Cert, now time.Time) bool {
	switch {
	case !q.bench && c.Bench():
		return false
	case q.namespace != "" && c.Namespace() != q.namespace:
		return false
	case q.root != "" && !strings.HasPrefix(c.Root, q.root):
		return false
	case q.within < 0 && now.Before(c.NotAfter):
		return false
	case q.within > 0 && !c.NotAfter.Before(now.Add(q.within)):
		return false
	case q.pod != "" && !strings.Contains(cmp.Or(c.Pod, c.SPIFFEID), q.pod):
		return false
	}
	return true
}

// counts are the whole inventory's figures (not the page's), for the summary.
type counts struct {
	Certificates int            `json:"certificates"` // current: not down, not bench
	Pods         int            `json:"pods"`
	Down         int            `json:"down"`
	ExpireIn1h   int            `json:"expire_within_1h"`
	Expired      int            `json:"expired"`
	Bench        int            `json:"bench_hidden"`
	ByNamespace  map[string]int `json:"namespaces"`
	ByRoot       map[string]int `json:"roots"` // current certificates by root fingerprint
	// LastHour is what the fleet did in the last hour, from the counters the
	// keepers keep in the inventory (no history read).
	LastHour inventory.Tally `json:"last_hour"`
}

// page is the answer of /api/inventory.
type page struct {
	Now         time.Time           `json:"now"`
	Total       int                 `json:"total"` // certificates matching the filter
	Offset      int                 `json:"offset"`
	Limit       int                 `json:"limit"`
	Certs       []inventory.Cert    `json:"certificates"`
	Counts      counts              `json:"counts"`
	BenchHidden int                 `json:"bench_hidden"`
	Trust       *inventory.Trust    `json:"trust,omitempty"`
	Skipped     []inventory.Skipped `json:"skipped,omitempty"`
}

// answer filters, sorts and cuts snap (sorted by expiry, as View keeps it).
func answer(snap inventory.Snapshot, q query, now time.Time) page {
	p := page{Now: now.UTC(), Offset: q.offset, Limit: q.limit, Trust: snap.Trust, Skipped: snap.Skipped,
		Counts: counts{ByNamespace: map[string]int{}, ByRoot: map[string]int{}, LastHour: snap.Counted(now, time.Hour)}}
	pods := map[string]struct{}{}
	hour := now.Add(time.Hour)
	var hits []*inventory.Cert
	for i := range snap.Certs {
		c := &snap.Certs[i]
		if c.Bench() {
			p.Counts.Bench++
		} else if c.Down {
			p.Counts.Down++
		} else {
			p.Counts.Certificates++
			p.Counts.ByNamespace[c.Namespace()]++
			p.Counts.ByRoot[c.Root]++
			if c.Pod != "" {
				pods[c.Pod] = struct{}{}
			}
			if !now.Before(c.NotAfter) {
				p.Counts.Expired++
			} else if c.NotAfter.Before(hour) {
				p.Counts.ExpireIn1h++
			}
		}
		if q.match(c, now) {
			hits = append(hits, c)
		}
	}
	p.Counts.Pods = len(pods)
	if !q.bench {
		p.BenchHidden = p.Counts.Bench
	}
	p.Total = len(hits)
	if q.sort != "expiry" {
		key := map[string]func(*inventory.Cert) string{
			"pod":       func(c *inventory.Cert) string { return cmp.Or(c.Pod, c.SPIFFEID) },
			"namespace": func(c *inventory.Cert) string { return c.Namespace() },
			"root":      func(c *inventory.Cert) string { return c.Root },
		}[q.sort]
		// Stable: within a key, soonest expiry first, as the snapshot is.
		slices.SortStableFunc(hits, func(a, b *inventory.Cert) int { return strings.Compare(key(a), key(b)) })
	}
	if q.desc {
		slices.Reverse(hits)
	}
	lo := min(q.offset, len(hits))
	hi := min(lo+q.limit, len(hits))
	p.Certs = make([]inventory.Cert, 0, hi-lo)
	for _, c := range hits[lo:hi] {
		cc := *c
		cc.Chain = nil // a page lists; inspect shows chains
		p.Certs = append(p.Certs, cc)
	}
	return p
}
