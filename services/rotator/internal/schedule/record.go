package schedule

import (
	"errors"
	"time"
)

// Record is the durable form of one entry: the certificate and the state of its
// renewal. The due time is not stored: it is recomputed, jitter included, from the
// certificate (RenewAt) or, once a renew-due went out, from SentAt and Attempt.
type Record struct {
	Pod       string `json:"p"`
	Resource  string `json:"r"`
	Serial    string `json:"s"`
	Root      string `json:"rt"`
	NotBefore int64  `json:"nb"` // unix nanoseconds
	NotAfter  int64  `json:"na"`
	Issued    int64  `json:"is,omitempty"` // unix nanoseconds; 0: not known (a record written before it was kept)
	Attempt   int    `json:"at,omitempty"` // renew-due sent so far for this certificate
	SentAt    int64  `json:"sa,omitempty"` // unix nanoseconds of the last one
	// Rev is the revision of the record in the durable store (not stored in it).
	Rev uint64 `json:"-"`
}

// Record returns the durable form of the entry for pod and resource.
func (s *Schedule) Record(pod, resource string) (Record, bool) {
	i, ok := s.index.get(key(pod, resource))
	if !ok {
		return Record{}, false
	}
	e := &s.entries[i]
	p, r := splitKey(e.key)
	return Record{Pod: p, Resource: r, Serial: e.serial, Root: s.roots[e.root],
		NotBefore: e.notBefore, NotAfter: e.notAfter, Issued: e.issued, Attempt: int(e.attempt), SentAt: e.sentAt, Rev: e.rev}, true
}

// Restore loads a record read back from durable state (r.Rev is its revision there).
// A renew-due already sent is not sent again before its retry deadline.
func (s *Schedule) Restore(r Record, now time.Time) (Result, error) {
	if r.Attempt < 0 || r.Attempt > 1<<15 {
		return Duplicate, errors.New("schedule: record attempt out of range")
	}
	c := Cert{Pod: r.Pod, Resource: r.Resource, Serial: r.Serial, Root: r.Root,
		NotBefore: time.Unix(0, r.NotBefore), NotAfter: time.Unix(0, r.NotAfter)}
	if r.Issued != 0 {
		c.Issued = time.Unix(0, r.Issued)
	}
	sentAt := r.SentAt
	if r.Attempt == 0 {
		sentAt = 0
	}
	return s.upsert(c, uint16(r.Attempt), sentAt, r.Rev, now)
}

// Replace makes the entry for r's pod and resource exactly r, whatever it held: how
// the rotator adopts what another replica wrote to the durable store.
func (s *Schedule) Replace(r Record, now time.Time) error {
	s.Remove(r.Pod, r.Resource)
	_, err := s.Restore(r, now)
	return err
}

// Remove deletes the entry for pod and resource, if any.
func (s *Schedule) Remove(pod, resource string) bool {
	i, ok := s.index.get(key(pod, resource))
	if ok {
		s.removeAt(i)
	}
	return ok
}

// SetRev records the durable revision of the entry, if it still holds serial.
func (s *Schedule) SetRev(pod, resource, serial string, rev uint64) {
	if i, ok := s.index.get(key(pod, resource)); ok && s.entries[i].serial == serial {
		s.entries[i].rev = rev
	}
}
