package inventory

import (
	"encoding/json"
	"slices"
	"sort"
)

// View is a bucket's records decoded one at a time, as a watch delivers them: a
// change costs the decoding of one record, not of the whole fleet, and the sorted
// Snapshot is built again only when asked for after a change. Not safe for
// concurrent use.
type View struct {
	certs   map[string]*Cert
	trust   *Trust
	windows map[string]*Window // counter records by key
	skipped map[string]Skipped
	snap    *Snapshot // nil after a change
}

// NewView returns an empty view.
func NewView() *View {
	return &View{certs: map[string]*Cert{}, windows: map[string]*Window{}, skipped: map[string]Skipped{}}
}

// Put takes the value of key, replacing what the view held for it. It reports
// whether the record could not be read (and is now listed as skipped).
func (v *View) Put(key string, value []byte) (skipped bool) {
	v.Delete(key)
	skip := func(err error) bool {
		v.skipped[key] = Skipped{Key: printable(key, maxReason), Reason: printable(err.Error(), maxReason)}
		return true
	}
	if key == TrustKey {
		var t Trust
		if err := json.Unmarshal(value, &t); err != nil {
			return skip(err)
		}
		v.trust = &t
		return false
	}
	if IsCounterKey(key) {
		var w Window
		if err := json.Unmarshal(value, &w); err != nil {
			return skip(err)
		}
		v.windows[key] = &w
		return false
	}
	var c Cert
	if err := json.Unmarshal(value, &c); err != nil {
		return skip(err)
	}
	if err := c.check(); err != nil {
		return skip(err)
	}
	v.certs[key] = &c
	return false
}

// Delete forgets key.
func (v *View) Delete(key string) {
	v.snap = nil
	if key == TrustKey {
		v.trust = nil
	}
	delete(v.certs, key)
	delete(v.windows, key)
	delete(v.skipped, key)
}

// Len is the number of certificate records held, and of records skipped.
func (v *View) Len() (certs, skipped int) { return len(v.certs), len(v.skipped) }

// Snapshot is the view as a Snapshot (certificates by expiry). The caller must not
// modify it: it is shared until the next change.
func (v *View) Snapshot() Snapshot {
	if v.snap != nil {
		return *v.snap
	}
	// Sorted as pointers, copied once in order: swapping whole records is what
	// made a 100,000-certificate snapshot cost 120 ms.
	ptrs := make([]*Cert, 0, len(v.certs))
	for _, c := range v.certs {
		ptrs = append(ptrs, c)
	}
	slices.SortFunc(ptrs, compareCerts)
	s := Snapshot{Trust: v.trust, Certs: make([]Cert, len(ptrs)), Windows: sortedWindows(v.windows)}
	for i, c := range ptrs {
		s.Certs[i] = *c
	}
	for _, k := range v.skipped {
		s.Skipped = append(s.Skipped, k)
	}
	sort.Slice(s.Skipped, func(i, j int) bool { return s.Skipped[i].Key < s.Skipped[j].Key })
	v.snap = &s
	return s
}

// CheckCert reports what a certificate record lacks that every reader relies on
// (another index than View: the operator's).
func CheckCert(c Cert) error { return c.check() }

// SkippedRecord is the Skipped entry of key, left out for err: both cut and made
// printable (they are the writer's bytes).
func SkippedRecord(key string, err error) Skipped {
	return Skipped{Key: printable(key, maxReason), Reason: printable(err.Error(), maxReason)}
}
