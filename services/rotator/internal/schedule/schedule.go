// Package schedule is the rotator's renewal schedule: one entry per (pod, resource),
// the newest certificate each holds, and when it must be renewed. It is a plain data
// structure driven by explicit times — no goroutines, no clock, no locks — so the
// rotator, its tests and its benchmarks all run the same code.
//
// Entries live in one slice of compact values (no per-entry pointers but two
// strings), found by an index map keyed by pod and resource. Two heaps of int32
// indices order them: pending (by due time) and ready (due, waiting for the
// fleet-wide rate limit, by expiry so the most urgent renewal goes first).
package schedule

import (
	"errors"
	"hash/fnv"
	"hash/maphash"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/backoff"
)

// DefaultResource is the SDS resource a certificate is for when none is named.
const DefaultResource = "default"

// Config sets the renewal policy.
type Config struct {
	GraceRatio float64       // renew when this fraction of the lifetime is left (Istio's SECRET_GRACE_PERIOD_RATIO)
	Jitter     float64       // ± added to GraceRatio per certificate (SECRET_GRACE_PERIOD_RATIO_JITTER)
	RetryAfter time.Duration // resend when no new certificate came this long after a renew-due
	RetryMax   time.Duration // cap of the doubling retry backoff
	Rate       float64       // renew-due per second, fleet-wide; <= 0: unlimited
	Burst      int           // renew-due that may go at once
}

// Cert is what the schedule needs of a cert.issued event. Pod is the pod's
// "<namespace>/<name>" (events.PodRef.String): two pods of one name in two
// namespaces are two entries.
type Cert struct {
	Pod, Resource, Serial string
	Root                  string // fingerprint of the root the chain ends at
	NotBefore, NotAfter   time.Time
	// Issued is when the signer issued it: the cert.issued event's time. The grace
	// ratio counts from it, as Istio's agent counts from when it got the certificate:
	// NotBefore is backdated (by the signer's 10 s, for clock skew), and counting from
	// it renews a 30 s certificate 10 s after issuance instead of 15 s. Zero, or
	// outside [NotBefore, NotAfter): NotBefore.
	Issued time.Time
}

// Result says what Upsert did.
type Result uint8

const (
	Added     Result = iota // a new (pod, resource)
	Replaced                // a newer certificate replaced the entry
	Duplicate               // the same certificate again: nothing changed
	Stale                   // an older certificate than the entry's: nothing changed
)

// Renewal is one renew-due to send.
type Renewal struct {
	Pod, Resource, Serial string
	NotAfter, Due         time.Time
	Reason                string
	Attempt               int  // 1 for the first send, then 2, 3, ... for retries
	RateLimited           bool // it waited for the rate limit
	// Retired: the certificate expires before a retry could help, so the entry
	// left the schedule after this send.
	Retired bool
	// Rev is the durable revision of the entry before this send, for
	// compare-and-set of its new state.
	Rev uint64
}

// Trust is the rotator's view of the trust bundle: the newest root and the roots it
// replaced. A leaf under an Old root is renewed at once (rate-limited).
type Trust struct {
	Current    string   `json:"current,omitempty"`
	Old        []string `json:"old,omitempty"`
	Generation uint64   `json:"generation,omitempty"`
}

// Stats is a snapshot for metrics.
type Stats struct {
	Scheduled   int       // entries
	Due         int       // due, waiting for the rate limit
	Overdue     int       // renew-due sent, no new certificate by the retry deadline
	MinNotAfter time.Time // earliest expiry in the fleet; zero when empty
	Expired     uint64    // entries retired because they expired without a successor
}

// entry is one (pod, resource). Times are unix nanoseconds.
type entry struct {
	key        string // pod + "\x00" + resource
	serial     string
	notBefore  int64
	notAfter   int64
	issued     int64 // 0: not known (Cert.Issued)
	due        int64
	sentAt     int64
	rev        uint64 // durable (KV) revision of the entry; 0 when not stored yet
	root       uint32 // index into Schedule.roots
	readyEpoch uint32 // Schedule.denials when the entry became ready
	hidx       int32
	attempt    uint16
	which      uint8
	flags      uint8
}

const (
	fRootRotation uint8 = 1 << iota // renew because its root was replaced
	fOverdue                        // counted in Schedule.overdue
)

// Schedule is not safe for concurrent use; the rotator holds a mutex around it.
type Schedule struct {
	cfg     Config
	entries []entry
	index   index
	extra   map[string][]string // pod -> its resources other than "default"
	pending queue
	ready   queue

	roots   []string
	rootID  map[string]uint32
	oldRoot []bool
	trust   Trust

	tokens  float64
	last    int64
	denials uint32
	overdue int
	expired uint64
}

// New returns an empty schedule.
func New(cfg Config) *Schedule {
	s := &Schedule{cfg: cfg, extra: map[string][]string{}, rootID: map[string]uint32{}}
	s.index = index{s: s, seed: maphash.MakeSeed()}
	s.pending = queue{s: s, which: inPending}
	s.ready = queue{s: s, which: inReady}
	s.tokens = float64(max(cfg.Burst, 1))
	return s
}

// Len is the number of entries.
func (s *Schedule) Len() int { return len(s.entries) }

func key(pod, resource string) string {
	if resource == "" {
		resource = DefaultResource
	}
	return pod + "\x00" + resource
}

func splitKey(k string) (pod, resource string) {
	pod, resource, _ = strings.Cut(k, "\x00")
	return pod, resource
}

func (s *Schedule) intern(root string) uint32 {
	if id, ok := s.rootID[root]; ok {
		return id
	}
	id := uint32(len(s.roots))
	s.roots = append(s.roots, root)
	s.rootID[root] = id
	s.oldRoot = append(s.oldRoot, slices.Contains(s.trust.Old, root))
	return id
}

// RenewAt is when cert c is due: issued + (1 - ratio) * (notAfter - issued), where
// issued is c.Issued (else notBefore) and ratio is cfg.GraceRatio plus a jitter in
// [-cfg.Jitter, +cfg.Jitter) drawn from a hash of the certificate, so every replica
// and every restart computes the same time.
func RenewAt(cfg Config, c Cert) time.Time {
	nb, na := c.NotBefore.UnixNano(), c.NotAfter.UnixNano()
	return time.Unix(0, dueOf(cfg, c.Serial, key(c.Pod, c.Resource), countFrom(nb, issuedNanos(c.Issued), na), na))
}

// issuedNanos is t in unix nanoseconds, 0 for the zero time.
func issuedNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// countFrom is where a certificate's renewal time counts from: its issuance when
// known and within its validity, else its notBefore.
func countFrom(nb, issued, na int64) int64 {
	if issued >= nb && issued < na {
		return issued
	}
	return nb
}

// dueOf is from + (1 - ratio) * (na - from), ratio jittered per certificate.
func dueOf(cfg Config, serial, k string, from, na int64) int64 {
	r := cfg.GraceRatio
	if cfg.Jitter > 0 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(serial))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(k))
		u := float64(h.Sum64()>>11) / (1 << 53) // [0, 1)
		r += (2*u - 1) * cfg.Jitter
	}
	r = math.Min(1, math.Max(0, r))
	return from + int64((1-r)*float64(na-from))
}

// retryWait is how long after renew-due number attempt (1 for the first send) it
// is sent again: pkg/backoff's schedule from RetryAfter doubling to RetryMax (no
// doubling without a RetryMax), unjittered, walked attempt-1 steps.
func (s *Schedule) retryWait(attempt uint16) int64 {
	p := backoff.Policy{First: s.cfg.RetryAfter, Max: s.cfg.RetryMax}
	if p.Max <= 0 {
		p.Max = p.First
	}
	p.First = min(p.First, p.Max)
	b := p.Start()
	for i := uint16(1); i < attempt && b.Current() < p.Max; i++ {
		b.Next()
	}
	return int64(b.Current())
}

// newer compares certificate (nb, na, issued, serial) with entry e: >0 newer, 0 same,
// <0 older. X.509 validity has whole seconds, so two renewals within one second tie on
// notBefore and notAfter: the issuance time (the cert.issued event's, in nanoseconds)
// tells them apart when both are known; the serial is only the last, arbitrary word.
func newer(nb, na, issued int64, serial string, e *entry) int {
	switch {
	case nb != e.notBefore:
		return cmp(nb, e.notBefore)
	case na != e.notAfter:
		return cmp(na, e.notAfter)
	case serial == e.serial:
		return 0
	case issued != 0 && e.issued != 0 && issued != e.issued:
		return cmp(issued, e.issued)
	case len(serial) != len(e.serial):
		return cmp(len(serial), len(e.serial))
	default:
		return strings.Compare(serial, e.serial)
	}
}

func cmp[T int | int64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

var errBadCert = errors.New("schedule: certificate needs a pod, a serial and notAfter after notBefore")

// Upsert schedules c, replacing the entry of the same pod and resource when c is
// newer (later notBefore, then later notAfter, then issued later, then the larger
// serial).
func (s *Schedule) Upsert(c Cert, now time.Time) (Result, error) {
	return s.upsert(c, 0, 0, 0, now)
}

func (s *Schedule) upsert(c Cert, attempt uint16, sentAt int64, rev uint64, now time.Time) (Result, error) {
	nb, na := c.NotBefore.UnixNano(), c.NotAfter.UnixNano()
	if c.Pod == "" || c.Serial == "" || na <= nb {
		return Duplicate, errBadCert
	}
	k := key(c.Pod, c.Resource)
	res := Added
	i, ok := s.index.get(k)
	if ok {
		e := &s.entries[i]
		switch n := newer(nb, na, issuedNanos(c.Issued), c.Serial, e); {
		case n == 0:
			return Duplicate, nil
		case n < 0:
			return Stale, nil
		}
		s.dequeue(i)
		if rev == 0 {
			rev = e.rev // still what the durable store holds
		}
		res = Replaced
	} else {
		i = int32(len(s.entries))
		s.entries = append(s.entries, entry{key: k, hidx: -1})
		s.index.put(k, i)
		if _, r := splitKey(k); r != DefaultResource {
			s.extra[c.Pod] = append(s.extra[c.Pod], r)
		}
	}
	e := &s.entries[i]
	*e = entry{key: k, serial: c.Serial, notBefore: nb, notAfter: na, issued: issuedNanos(c.Issued), sentAt: sentAt,
		rev: rev, root: s.intern(c.Root), attempt: attempt, hidx: -1}
	s.enqueue(i, now.UnixNano())
	return res, nil
}

// enqueue puts entry i in the pending queue at its due time.
func (s *Schedule) enqueue(i int32, now int64) {
	e := &s.entries[i]
	switch {
	case e.attempt > 0:
		e.due = e.sentAt + s.retryWait(e.attempt)
	case s.oldRoot[e.root]:
		e.flags |= fRootRotation
		e.due = min(now, dueOf(s.cfg, e.serial, e.key, countFrom(e.notBefore, e.issued, e.notAfter), e.notAfter))
	default:
		e.due = dueOf(s.cfg, e.serial, e.key, countFrom(e.notBefore, e.issued, e.notAfter), e.notAfter)
	}
	s.pending.push(i)
}

// dequeue takes entry i out of whichever queue holds it and clears its overdue mark.
func (s *Schedule) dequeue(i int32) {
	e := &s.entries[i]
	switch e.which {
	case inPending:
		s.pending.remove(i)
	case inReady:
		s.ready.remove(i)
	}
	if e.flags&fOverdue != 0 {
		s.overdue--
		e.flags &^= fOverdue
	}
}

// removeAt deletes entry i, moving the last entry into its slot.
func (s *Schedule) removeAt(i int32) {
	s.dequeue(i)
	k := s.entries[i].key
	s.index.del(k)
	if pod, r := splitKey(k); r != DefaultResource {
		rs := slices.DeleteFunc(s.extra[pod], func(x string) bool { return x == r })
		if len(rs) == 0 {
			delete(s.extra, pod)
		} else {
			s.extra[pod] = rs
		}
	}
	last := int32(len(s.entries) - 1)
	if i != last {
		s.entries[i] = s.entries[last]
		moved := &s.entries[i]
		s.index.move(moved.key, i) // finds the slot of position last: same key
		switch moved.which {
		case inPending:
			s.pending.idx[moved.hidx] = i
		case inReady:
			s.ready.idx[moved.hidx] = i
		}
	}
	s.entries[last] = entry{}
	s.entries = s.entries[:last]
}

// RetirePod removes every entry of pod and returns the resources it had.
func (s *Schedule) RetirePod(pod string) []string {
	return s.RetirePodBefore(pod, time.Time{})
}

// RetirePodBefore is RetirePod for the entries of certificates issued before t (all
// when t is zero): a pod.down, read from the pods' stream, may be applied after the
// cert.issued of the pod that replaced the one that went down (same name), which
// comes from the CA's stream; that newer certificate stays scheduled.
func (s *Schedule) RetirePodBefore(pod string, t time.Time) []string {
	var out []string
	for _, r := range append([]string{DefaultResource}, s.extra[pod]...) {
		if i, ok := s.index.get(key(pod, r)); ok {
			if e := &s.entries[i]; !t.IsZero() && !time.Unix(0, issuedOrNotBefore(e)).Before(t) {
				continue
			}
			s.removeAt(i)
			out = append(out, r)
		}
	}
	return out
}

// issuedOrNotBefore is when e's certificate was issued, as well as known.
func issuedOrNotBefore(e *entry) int64 {
	if e.issued != 0 {
		return e.issued
	}
	return e.notBefore
}
