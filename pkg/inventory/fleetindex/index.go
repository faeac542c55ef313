// Package fleetindex is the operator's in-memory index of the certificate
// inventory, fed one record at a time by a watch of the bucket (the bus stays the
// source of truth; a restarted replica builds the index again from the watch), and
// the parsing of its API's queries; meshctl builds the same index from the bucket
// read whole when it has no operator to ask (ReadBucket). It
// keeps the records without their chains, sorted in the orders a page asks for
// (expiry, namespace, pod, name, root) and the fleet's counts, so that a page, a
// filter, a sort or one pod's records cost what the page holds, not what the fleet
// holds. Changes are staged and merged into the orders in one linear pass: a burst
// of thousands of records is one merge, not thousands of inserts. Not safe for
// concurrent use.
package fleetindex

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"time"
	"unique"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/nats-io/nats.go"
)

// entry is one certificate record as the index holds it: the record without its
// chain, and the keys its orders sort on.
type entry struct {
	key     string
	c       inventory.Cert
	ns      string
	name    string    // the pod's name, "" without a pod
	holder  string    // the pod ("<ns>/<name>"), else the SPIFFE ID
	serial  string    // lower case
	overdue time.Time // when its renewal is overdue (inventory.OverdueRatio of its life)
	renew   time.Time // when it is due for renewal (inventory.Cert.RenewsBy)
	bench   bool
	merged  bool // in the orders (else still staged)
	dropped bool // deleted while staged: never merged
}

func newEntry(key string, c inventory.Cert) *entry {
	c.Chain = nil // a page lists; inspect reads chains from the bucket
	// Few distinct values among 100,000 records: one copy of each.
	for _, s := range []*string{&c.Resource, &c.Signer, &c.Root, &c.CertSigner, &c.KeyAlgorithm, &c.LastRenewal} {
		*s = unique.Make(*s).Value()
	}
	e := &entry{key: key, c: c, ns: unique.Make(c.Namespace()).Value(), holder: c.Pod, serial: strings.ToLower(c.Serial)}
	if _, name, ok := strings.Cut(c.Pod, "/"); ok {
		e.name = name
	} else {
		e.holder = c.SPIFFEID
	}
	e.bench = e.ns == events.BenchNamespace
	life := c.NotAfter.Sub(c.NotBefore)
	e.overdue = c.NotBefore.Add(time.Duration(float64(life) * inventory.OverdueRatio))
	e.renew = c.RenewsBy()
	return e
}

// current reports whether e counts in the fleet's figures: not bench's, not down.
func (e *entry) current() bool { return !e.bench && !e.c.Down }

// Index is the inventory as the operator serves it.
type Index struct {
	recs    map[string]*entry
	trust   *inventory.Trust
	windows map[string]*inventory.Window
	skipped map[string]inventory.Skipped
	pending []*entry // put since the last merge
	removed []*entry // in the orders, deleted or replaced since the last merge

	fleet, all orderSet // without and with meshctl bench's certificates
	// Current certificates (not bench's, not down) by expiry and by the time their
	// renewal is overdue: how many expired, expire soon, are overdue.
	curExpiry, curOverdue, curRenew order
	serial                          order             // every record, bench's too, by serial: inspect's lookup
	silent                          map[string]*entry // current holders told to renew again with no new certificate
	tally                           tally
}

// New returns an empty index.
func New() *Index {
	ix := &Index{recs: map[string]*entry{}, windows: map[string]*inventory.Window{}, skipped: map[string]inventory.Skipped{},
		silent: map[string]*entry{}, tally: newTally()}
	ix.fleet = newOrderSet(func(e *entry) bool { return !e.bench })
	ix.all = newOrderSet(func(*entry) bool { return true })
	ix.curExpiry = order{cmp: byExpiry, keep: (*entry).current}
	ix.curOverdue = order{cmp: byOverdue, keep: (*entry).current}
	ix.curRenew = order{cmp: byRenew, keep: (*entry).current}
	ix.serial = order{cmp: bySerial, keep: func(*entry) bool { return true }}
	return ix
}

// Put takes the value of key, replacing what the index held for it. It reports
// whether the record could not be read (and is now listed as skipped).
func (ix *Index) Put(key string, value []byte) (skipped bool) {
	ix.Delete(key)
	switch {
	case key == inventory.TrustKey:
		var t inventory.Trust
		if err := json.Unmarshal(value, &t); err != nil {
			return ix.skip(key, err)
		}
		ix.trust = &t
	case inventory.IsCounterKey(key):
		var w inventory.Window
		if err := json.Unmarshal(value, &w); err != nil {
			return ix.skip(key, err)
		}
		ix.windows[key] = &w
	default:
		var c inventory.Cert
		err := json.Unmarshal(value, &c)
		if err == nil {
			err = inventory.CheckCert(c)
		}
		if err != nil {
			return ix.skip(key, err)
		}
		e := newEntry(key, c)
		ix.recs[key] = e
		ix.pending = append(ix.pending, e)
		ix.tally.add(e, 1)
		if e.current() && e.retrying() {
			ix.silent[key] = e
		}
	}
	return false
}

func (ix *Index) skip(key string, err error) bool {
	ix.skipped[key] = inventory.SkippedRecord(key, err)
	return true
}

// Delete forgets key.
func (ix *Index) Delete(key string) {
	if key == inventory.TrustKey {
		ix.trust = nil
	}
	delete(ix.windows, key)
	delete(ix.skipped, key)
	if e, ok := ix.recs[key]; ok {
		if e.merged {
			ix.removed = append(ix.removed, e)
		} else {
			e.dropped = true
		}
		ix.tally.add(e, -1)
		delete(ix.recs, key)
		delete(ix.silent, key)
	}
}

// Len is the number of certificate records held, and of records skipped.
func (ix *Index) Len() (certs, skipped int) { return len(ix.recs), len(ix.skipped) }

// Flush merges the changes since the last merge into the orders: linear in the
// fleet, n log n in the changes. Pages flush first; the watch flushes after a
// burst, so that a page rarely pays for it.
func (ix *Index) Flush() {
	if len(ix.pending) == 0 && len(ix.removed) == 0 {
		return
	}
	adds := slices.DeleteFunc(ix.pending, func(e *entry) bool { return e.dropped })
	for _, o := range ix.orders() {
		o.merge(adds, ix.removed)
	}
	for _, e := range adds {
		e.merged = true
	}
	ix.pending, ix.removed = nil, nil
}

func (ix *Index) orders() []*order {
	return append(append(ix.fleet.list(), ix.all.list()...), &ix.curExpiry, &ix.curOverdue, &ix.curRenew, &ix.serial)
}

// Trust is the trust record (nil when none).
func (ix *Index) Trust() *inventory.Trust { return ix.trust }

// Counted sums the counter records of the span before now.
func (ix *Index) Counted(now time.Time, span time.Duration) inventory.Tally {
	ws := make([]inventory.Window, 0, len(ix.windows))
	for _, w := range ix.windows {
		ws = append(ws, *w)
	}
	return inventory.Snapshot{Windows: ws}.Counted(now, span)
}

// Skipped are the records that could not be read, by key.
func (ix *Index) Skipped() []inventory.Skipped {
	out := make([]inventory.Skipped, 0, len(ix.skipped))
	for _, k := range ix.skipped {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// ReadBucket builds an index from the bucket read whole with read-only rights
// (inventory.ReadValues): what a reader does without the operator's API.
func ReadBucket(ctx context.Context, nc *nats.Conn) (*Index, error) {
	values, err := inventory.ReadValues(ctx, nc)
	if err != nil {
		return nil, err
	}
	ix := New()
	for k, v := range values {
		ix.Put(k, v)
	}
	ix.Flush()
	return ix, nil
}
