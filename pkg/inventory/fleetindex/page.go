package fleetindex

import (
	"slices"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/inventory"
)

// Query is one page: a filter, an order and a cut.
type Query struct {
	Namespace string // exact namespace of the holder
	// Pod is the start of the pod's name, or of "<namespace>/<name>" when it holds
	// a '/'; for a certificate without a pod, the start of its SPIFFE ID.
	Pod    string
	Root   string        // prefix of the root's fingerprint (lower case)
	Serial string        // prefix of the serial (lower-case hex, at least 6 digits)
	Within time.Duration // expiring within this (0: any); negative: expired only
	State  string        // "" any, "current", "down", "overdue" (current, renewal overdue or expired), "silent"
	Sort   string        // expiry (default), pod, namespace, root
	Desc   bool
	Offset int
	Limit  int
	Bench  bool // include meshctl bench's certificates
}

// States are the values of Query.State.
var States = []string{"", "current", "down", "overdue", "silent"}

// Sorts are the values of Query.Sort.
var Sorts = []string{"expiry", "pod", "namespace", "root"}

func (q Query) match(e *entry, now time.Time) bool {
	switch {
	case !q.Bench && e.bench:
		return false
	case q.Namespace != "" && e.ns != q.Namespace:
		return false
	case q.Root != "" && !strings.HasPrefix(e.c.Root, q.Root):
		return false
	case q.Serial != "" && !strings.HasPrefix(e.serial, q.Serial):
		return false
	case q.Within < 0 && now.Before(e.c.NotAfter):
		return false
	case q.Within > 0 && !e.c.NotAfter.Before(now.Add(q.Within)):
		return false
	case q.Pod != "" && !q.podMatch(e):
		return false
	}
	switch q.State {
	case "current":
		return e.current()
	case "down":
		return e.c.Down
	case "overdue":
		return e.current() && e.overdue.Before(now)
	case "silent":
		return e.current() && e.retrying()
	}
	return true
}

func (q Query) podMatch(e *entry) bool {
	if strings.Contains(q.Pod, "/") {
		return strings.HasPrefix(e.holder, q.Pod)
	}
	return e.name != "" && strings.HasPrefix(e.name, q.Pod)
}

// Counts is the summary at now.
func (ix *Index) Counts(now time.Time) inventory.Counts {
	ix.Flush()
	t := &ix.tally
	c := inventory.Counts{Certificates: t.current, Pods: len(t.upPods), Down: t.down, Bench: t.bench, Silent: t.retrying,
		ByNamespace: copyMap(t.byNamespace), ByRoot: copyMap(t.byRoot), Named: copyMap(t.named), MeshRoots: copyMap(t.meshRoots), LastHour: ix.Counted(now, time.Hour)}
	for p := range t.downPods {
		if t.upPods[p] == 0 {
			c.DownPods++
		}
	}
	exp := ix.curExpiry.s
	expired := before(exp, notAfter, now, true)
	c.Expired = len(expired)
	c.LivePodRoots = copyMap(t.livePods)
	for _, e := range expired { // few in a healthy fleet: the cost of the expired, not of the fleet
		if e.livePod() {
			if c.LivePodRoots[e.c.Root]--; c.LivePodRoots[e.c.Root] == 0 {
				delete(c.LivePodRoots, e.c.Root)
			}
		}
	}
	c.ExpireIn1h = len(before(exp, notAfter, now.Add(time.Hour), false)) - c.Expired
	c.Overdue = len(before(ix.curOverdue.s, overdueAt, now, false)) - c.Expired
	// An expired certificate was due before now too (half its life).
	c.RenewIn1h = len(before(ix.curRenew.s, renewAt, now.Add(time.Hour), false)) - c.Expired
	return c
}

func copyMap(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Page is one page of the index at now, with the whole inventory's counts.
func (ix *Index) Page(q Query, now time.Time) inventory.Page {
	p := inventory.Page{Now: now.UTC(), Offset: q.Offset, Limit: q.Limit, Trust: ix.trust, Skipped: ix.Skipped(), Counts: ix.Counts(now)}
	if !q.Bench {
		p.BenchHidden = p.Counts.Bench
	}
	hits := ix.find(q, now)
	p.Total = len(hits)
	lo := min(q.Offset, len(hits))
	hi := min(lo+q.Limit, len(hits))
	p.Certs = make([]inventory.Cert, 0, hi-lo)
	for i := lo; i < hi; i++ {
		j := i
		if q.Desc {
			j = len(hits) - 1 - i
		}
		p.Certs = append(p.Certs, hits[j].c)
	}
	return p
}

// find is the entries that match q, in q's order (ascending): a run of one of
// the orders when the filter is one, else the matches of the narrowest run,
// sorted.
func (ix *Index) find(q Query, now time.Time) []*entry {
	set := &ix.fleet
	if q.Bench {
		set = &ix.all
	}
	want := set.bySort(q.Sort)
	cand, done := ix.narrow(set, q, now)
	if done != nil && done.covers(q) && done.order == want {
		return cand
	}
	hits := make([]*entry, 0, min(len(cand), 1024))
	for _, e := range cand {
		if q.match(e, now) {
			hits = append(hits, e)
		}
	}
	if done == nil || done.order != want {
		slices.SortFunc(hits, want.cmp)
	}
	return hits
}

// covered is what a run of an order answers of a query by itself: the order
// it is in, and the filters it applies.
type covered struct {
	order                   *order
	ns, root, within, state bool
}

// covers reports whether the run holds only matches of q.
func (c *covered) covers(q Query) bool {
	return q.Pod == "" && q.Serial == "" && (q.Namespace == "" || c.ns) && (q.Root == "" || c.root) && (q.Within == 0 || c.within) && (q.State == "" || c.state)
}

// narrow picks the smallest run of an order that holds every match of q, and says
// what it covers (nil: a set of candidates in no order, to be filtered and sorted).
func (ix *Index) narrow(set *orderSet, q Query, now time.Time) ([]*entry, *covered) {
	switch {
	case q.Serial != "":
		return span(ix.serial.s, serialOf, q.Serial), nil
	case q.Pod != "":
		return ix.podCandidates(set, q.Pod), nil
	case q.State == "overdue":
		return before(ix.curOverdue.s, overdueAt, now, false), nil
	case q.State == "silent":
		out := make([]*entry, 0, len(ix.silent))
		for _, e := range ix.silent {
			out = append(out, e)
		}
		return out, nil
	case q.Namespace != "" && q.Sort == "pod":
		return equal(set.pod.s, nsOf, q.Namespace), &covered{order: &set.pod, ns: true}
	case q.Namespace != "":
		// One namespace's run is by expiry: the namespace order and the expiry order at once.
		run, within := cutWithin(equal(set.namespace.s, nsOf, q.Namespace), q.Within, now)
		return run, &covered{order: byExpiryOr(set, q.Sort, &set.namespace), ns: true, within: within}
	case q.Root != "":
		run := span(set.root.s, rootOf, q.Root)
		if len(run) == 0 || run[0].c.Root != run[len(run)-1].c.Root {
			return run, &covered{order: &set.root, root: true}
		}
		// One root's run is by expiry too.
		run, within := cutWithin(run, q.Within, now)
		return run, &covered{order: byExpiryOr(set, q.Sort, &set.root), root: true, within: within}
	}
	o := set.bySort(q.Sort)
	if o == &set.expiry {
		run, within := cutWithin(o.s, q.Within, now)
		return run, &covered{order: o, within: within}
	}
	return o.s, &covered{order: o}
}

// byExpiryOr is the expiry order when the page is sorted by expiry, else o: for a
// run that is in both orders.
func byExpiryOr(set *orderSet, sort string, o *order) *order {
	if set.bySort(sort) == &set.expiry {
		return &set.expiry
	}
	return o
}

// cutWithin cuts a run sorted by expiry to the certificates expired, or expiring
// within d (d = 0: no cut).
func cutWithin(run []*entry, d time.Duration, now time.Time) ([]*entry, bool) {
	switch {
	case d < 0:
		return before(run, notAfter, now, true), true
	case d > 0:
		return before(run, notAfter, now.Add(d), false), true
	}
	return run, false
}

// podCandidates is every entry that may match a pod filter: the run of holders
// ("<namespace>/<name>", or the SPIFFE ID) or of pod names that start with it.
func (ix *Index) podCandidates(set *orderSet, pod string) []*entry {
	if strings.Contains(pod, "/") {
		return span(set.holder.s, holderOf, pod)
	}
	return span(set.name.s, nameOf, pod)
}

// ExpiringBy is how many current certificates expire at t or before.
func (ix *Index) ExpiringBy(t time.Time) int {
	ix.Flush()
	return len(before(ix.curExpiry.s, notAfter, t, true))
}
