package fleetindex

import (
	"cmp"
	"slices"
	"sort"
	"strings"
	"time"
)

// order is the index's entries in one order: a sorted slice, merged with the
// staged changes in one pass (the spare slice is the next merge's destination, so
// that a merge allocates nothing once the fleet has stopped growing).
type order struct {
	cmp   func(a, b *entry) int
	keep  func(*entry) bool
	s     []*entry
	spare []*entry
}

// merge takes dels out and adds (unsorted) in: each found by binary search, the
// runs between them copied whole, so that one change in 100,000 costs a few dozen
// comparisons and one copy of the slice, not 100,000 comparisons.
func (o *order) merge(adds, dels []*entry) {
	in := make([]*entry, 0, len(adds))
	for _, e := range adds {
		if o.keep(e) {
			in = append(in, e)
		}
	}
	slices.SortFunc(in, o.cmp)
	var gone []int
	for _, e := range dels {
		if i, ok := slices.BinarySearchFunc(o.s, e, o.cmp); ok && o.keep(e) {
			gone = append(gone, i)
		}
	}
	slices.Sort(gone)
	out := o.spare[:0]
	if n := len(o.s) + len(in) - len(gone); cap(out) < n {
		out = make([]*entry, 0, n*5/4)
	}
	from, g := 0, 0
	for _, e := range in {
		at, _ := slices.BinarySearchFunc(o.s, e, o.cmp)
		out, g = appendLive(out, o.s[:at], from, gone, g)
		out, from = append(out, e), at
	}
	out, _ = appendLive(out, o.s, from, gone, g)
	clear(o.s) // the old entries are not kept alive by the spare
	o.spare, o.s = o.s[:0], out
}

// appendLive appends s[from:] to out, less the indexes gone[g:] (sorted) that fall
// in it, and returns the next of gone to look at.
func appendLive(out, s []*entry, from int, gone []int, g int) ([]*entry, int) {
	for ; g < len(gone) && gone[g] < len(s); g++ {
		out = append(out, s[from:gone[g]]...)
		from = gone[g] + 1
	}
	return append(out, s[from:]...), g
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

func byRoot(a, b *entry) int { return cmp.Or(strings.Compare(a.c.Root, b.c.Root), byExpiry(a, b)) }

// orderSet is the page orders of one population (the fleet, or the fleet with
// meshctl bench's load).
type orderSet struct {
	expiry, namespace, pod, name, root order
}

func newOrderSet(keep func(*entry) bool) orderSet {
	return orderSet{
		expiry: order{cmp: byExpiry, keep: keep}, namespace: order{cmp: byNamespace, keep: keep},
		pod: order{cmp: byPod, keep: keep}, name: order{cmp: byName, keep: keep}, root: order{cmp: byRoot, keep: keep},
	}
}

func (s *orderSet) list() []*order {
	return []*order{&s.expiry, &s.namespace, &s.pod, &s.name, &s.root}
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
