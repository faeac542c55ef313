package fleetindex

import (
	"cmp"
	"slices"
	"sort"
	"strings"
	"time"
)

// order is the index's entries in one order: a sorted slice, changed in place
// (no second slice: at 100,000 certificates each order is 800 KB).
type order struct {
	cmp  func(a, b *entry) int
	keep func(*entry) bool
	s    []*entry
}

// merge takes dels out and adds (unsorted) in, in place: each found by binary
// search and the runs between them moved whole, so that one change in 100,000
// costs a few dozen comparisons and one move of the slice, not 100,000
// comparisons.
func (o *order) merge(adds, dels []*entry) {
	var gone []int
	for _, e := range dels {
		if i, ok := slices.BinarySearchFunc(o.s, e, o.cmp); ok && o.keep(e) {
			gone = append(gone, i)
		}
	}
	slices.Sort(gone)
	o.s = compact(o.s, gone)
	in := make([]*entry, 0, len(adds))
	for _, e := range adds {
		if o.keep(e) {
			in = append(in, e)
		}
	}
	slices.SortFunc(in, o.cmp)
	n := len(o.s)
	at := make([]int, len(in))
	for i, e := range in {
		at[i], _ = slices.BinarySearchFunc(o.s[:n], e, o.cmp)
	}
	s := slices.Grow(o.s, len(in))[:n+len(in)]
	// From the end: the entries at or after at[i] move up by i+1, the number of
	// additions before them.
	hi := n
	for i := len(in) - 1; i >= 0; i-- {
		copy(s[at[i]+i+1:], s[at[i]:hi])
		s[at[i]+i] = in[i]
		hi = at[i]
	}
	o.s = s
}

// compact removes the entries at the indexes gone (sorted) from s, in place.
func compact(s []*entry, gone []int) []*entry {
	if len(gone) == 0 {
		return s
	}
	w := gone[0]
	for g, i := range gone {
		next := len(s)
		if g+1 < len(gone) {
			next = gone[g+1]
		}
		w += copy(s[w:], s[i+1:next])
	}
	clear(s[w:]) // the removed entries are not kept alive
	return s[:w]
}

// Every order ends with the key: a total order, so that one entry has one place.
func byExpiry(a, b *entry) int {
	return cmp.Or(a.c.NotAfter.Compare(b.c.NotAfter), strings.Compare(a.holder, b.holder), strings.Compare(a.key, b.key))
}

func byOverdue(a, b *entry) int {
	return cmp.Or(a.overdue.Compare(b.overdue), strings.Compare(a.key, b.key))
}

func byRenew(a, b *entry) int {
	return cmp.Or(a.renew.Compare(b.renew), strings.Compare(a.key, b.key))
}

func byNamespace(a, b *entry) int { return cmp.Or(strings.Compare(a.ns, b.ns), byExpiry(a, b)) }

// byPod is by namespace, then by holder: the pods of a namespace are one run,
// by name.
func byPod(a, b *entry) int {
	return cmp.Or(strings.Compare(a.ns, b.ns), strings.Compare(a.holder, b.holder), byExpiry(a, b))
}

// byName is by the pod's name, whatever its namespace (the pod filter without a
// namespace); certificates without a pod first.
func byName(a, b *entry) int { return cmp.Or(strings.Compare(a.name, b.name), byPod(a, b)) }

// byHolder is by "<namespace>/<name>", or the SPIFFE ID without a pod: the pod
// filter with a '/'.
func byHolder(a, b *entry) int { return cmp.Or(strings.Compare(a.holder, b.holder), byExpiry(a, b)) }

func bySerial(a, b *entry) int {
	return cmp.Or(strings.Compare(a.serial, b.serial), strings.Compare(a.key, b.key))
}

func byRoot(a, b *entry) int { return cmp.Or(strings.Compare(a.c.Root, b.c.Root), byExpiry(a, b)) }

// orderSet is the page orders of one population (the fleet, or the fleet with
// meshctl bench's load).
type orderSet struct {
	expiry, namespace, pod, name, holder, root order
}

func newOrderSet(keep func(*entry) bool) orderSet {
	return orderSet{
		expiry: order{cmp: byExpiry, keep: keep}, namespace: order{cmp: byNamespace, keep: keep},
		pod: order{cmp: byPod, keep: keep}, name: order{cmp: byName, keep: keep},
		holder: order{cmp: byHolder, keep: keep}, root: order{cmp: byRoot, keep: keep},
	}
}

func (s *orderSet) list() []*order {
	return []*order{&s.expiry, &s.namespace, &s.pod, &s.name, &s.holder, &s.root}
}

// bySort is the order of a page's sort key.
func (s *orderSet) bySort(key string) *order {
	switch key {
	case "pod":
		return &s.pod
	case "namespace":
		return &s.namespace
	case "root":
		return &s.root
	}
	return &s.expiry
}

// span is the run of s whose entries have key(e) starting with prefix, given that s
// is sorted by key first.
func span(s []*entry, key func(*entry) string, prefix string) []*entry {
	lo := sort.Search(len(s), func(i int) bool { return key(s[i]) >= prefix })
	hi := lo + sort.Search(len(s)-lo, func(i int) bool { return !strings.HasPrefix(key(s[lo+i]), prefix) })
	return s[lo:hi]
}

// equal is the run of s whose key(e) is exactly v (s sorted by key first).
func equal(s []*entry, key func(*entry) string, v string) []*entry {
	lo := sort.Search(len(s), func(i int) bool { return key(s[i]) >= v })
	hi := lo + sort.Search(len(s)-lo, func(i int) bool { return key(s[lo+i]) != v })
	return s[lo:hi]
}

// before is the first entries of s (sorted by at), those whose at is before t
// (or at t too, when inclusive).
func before(s []*entry, at func(*entry) time.Time, t time.Time, inclusive bool) []*entry {
	return s[:sort.Search(len(s), func(i int) bool {
		if inclusive {
			return at(s[i]).After(t)
		}
		return !at(s[i]).Before(t)
	})]
}

func notAfter(e *entry) time.Time  { return e.c.NotAfter }
func overdueAt(e *entry) time.Time { return e.overdue }
func renewAt(e *entry) time.Time   { return e.renew }
func nsOf(e *entry) string         { return e.ns }
func holderOf(e *entry) string     { return e.holder }
func nameOf(e *entry) string       { return e.name }
func rootOf(e *entry) string       { return e.c.Root }
func serialOf(e *entry) string     { return e.serial }
