package inventory

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
)

// The fleet's recent counts — certificates issued, renewals sent, NACKs — are kept
// in the bucket beside the records, one record per minute in a ring of
// CounterSlots keys ("count.<slot>"), so that a reader (meshctl status, the
// operator's page) sums the last hour from a few records instead of replaying the
// last hour of events. The keepers count each event they fold in and add their
// counts to the minute's record with a compare-and-set, so replicas may count side
// by side; a record whose minute has passed out of the ring is started again.

// CounterSlots is how many minutes the ring keeps: two hours, so that the last
// hour is always whole.
const CounterSlots = 120

// counterPrefix starts the keys of the counter records.
const counterPrefix = "count."

// CounterKey is the key of the record that holds minute (Unix minutes).
func CounterKey(minute int64) string {
	return fmt.Sprintf("%s%03d", counterPrefix, minute%CounterSlots)
}

// IsCounterKey reports whether key holds a counter record.
func IsCounterKey(key string) bool { return strings.HasPrefix(key, counterPrefix) }

// Window is one minute's counts.
type Window struct {
	Minute int64 `json:"minute"` // Unix time / 60
	// Issued counts cert.issued by signer instance, meshctl bench's left out.
	Issued map[string]int `json:"issued,omitempty"`
	// Renewals counts rotation.renew_sent by reason, Rotators by rotator instance
	// (meshctl bench's left out of both).
	Renewals map[string]int `json:"renewals,omitempty"`
	Rotators map[string]int `json:"rotators,omitempty"`
	SDSNacks int            `json:"sds_nacks,omitempty"`
	XDSNacks int            `json:"xds_nacks,omitempty"`
	// Bench counts meshctl bench's events (namespace events.BenchNamespace).
	Bench int `json:"bench,omitempty"`
}

// MinuteOf is the Unix minute of t.
func MinuteOf(t time.Time) int64 { return t.Unix() / 60 }

// Count is what event p (published at meta.Time) adds to its minute's window, and
// whether it counts at all. An event from the future (a skewed clock) counts in
// now's minute; one older than the ring does not count.
func Count(p events.Payload, meta events.Meta, now time.Time) (Window, bool) {
	at := meta.Time
	if at.IsZero() || at.After(now) {
		at = now
	}
	w := Window{Minute: MinuteOf(at)}
	if w.Minute <= MinuteOf(now)-CounterSlots {
		return Window{}, false
	}
	bench := func(pod events.PodRef) bool { return pod.Namespace == events.BenchNamespace }
	switch e := p.(type) {
	case events.CertIssued:
		if bench(e.Pod) || e.Pod.IsZero() && events.NamespaceOfID(e.SPIFFEID) == events.BenchNamespace {
			w.Bench = 1
		} else {
			w.Issued = map[string]int{e.Signer: 1}
		}
	case events.RenewDue:
		if bench(e.Pod) {
			w.Bench = 1
		} else {
			w.Renewals = map[string]int{e.Reason: 1}
			w.Rotators = map[string]int{strings.TrimPrefix(meta.Source, "rotator/"): 1}
		}
	case events.SDSNack:
		w.SDSNacks = 1
	case events.XDSNack:
		w.XDSNacks = 1
	default:
		return Window{}, false
	}
	return w, true
}

// Add adds d's counts to w (same minute).
func (w *Window) Add(d Window) {
	addAll := func(dst *map[string]int, src map[string]int) {
		for k, n := range src {
			if *dst == nil {
				*dst = map[string]int{}
			}
			(*dst)[k] += n
		}
	}
	addAll(&w.Issued, d.Issued)
	addAll(&w.Renewals, d.Renewals)
	addAll(&w.Rotators, d.Rotators)
	w.SDSNacks += d.SDSNacks
	w.XDSNacks += d.XDSNacks
	w.Bench += d.Bench
}

// merge folds delta d into the stored record cur (nil: none yet): the minute's
// counts grow; a record of an older minute (the ring came round) is replaced; a
// record of a newer minute wins over d, which is older than the ring.
func merge(cur []byte, d Window) ([]byte, bool, error) {
	var w Window
	if cur != nil && json.Unmarshal(cur, &w) == nil && w.Minute > d.Minute {
		return nil, false, nil
	}
	if w.Minute != d.Minute {
		w = Window{Minute: d.Minute}
	}
	w.Add(d)
	b, err := json.Marshal(w)
	return b, true, err
}

// Tally is the sum of the windows of a span of time.
type Tally struct {
	Since    time.Time      `json:"since"` // start of the oldest minute counted
	Issued   map[string]int `json:"issued"`
	Renewals map[string]int `json:"renewals"`
	Rotators map[string]int `json:"rotators"`
	SDSNacks int            `json:"sds_nacks"`
	XDSNacks int            `json:"xds_nacks"`
	Bench    int            `json:"bench"`
}

// IssuedTotal is the number of certificates issued.
func (t Tally) IssuedTotal() int { return sum(t.Issued) }

// RenewalTotal is the number of renewals sent.
func (t Tally) RenewalTotal() int { return sum(t.Renewals) }

// Retries are the renewals sent again because the first brought no certificate.
func (t Tally) Retries() int { return t.Renewals[events.RenewRetry] }

// Failures are the NACKs and renewal retries.
func (t Tally) Failures() int { return t.SDSNacks + t.XDSNacks + t.Retries() }

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// Counted sums the windows of the last span up to now, by whole minutes: the
// current minute and the span/1m - 1 before it.
func (s Snapshot) Counted(now time.Time, span time.Duration) Tally {
	minutes := max(int64(span/time.Minute), 1)
	from := MinuteOf(now) - minutes + 1
	t := Tally{Since: time.Unix(from*60, 0).UTC(), Issued: map[string]int{}, Renewals: map[string]int{}, Rotators: map[string]int{}}
	for _, w := range s.Windows {
		if w.Minute < from || w.Minute > MinuteOf(now) {
			continue
		}
		for k, n := range w.Issued {
			t.Issued[k] += n
		}
		for k, n := range w.Renewals {
			t.Renewals[k] += n
		}
		for k, n := range w.Rotators {
			t.Rotators[k] += n
		}
		t.SDSNacks += w.SDSNacks
		t.XDSNacks += w.XDSNacks
		t.Bench += w.Bench
	}
	return t
}

// sortedWindows is ws by minute.
func sortedWindows(ws map[string]*Window) []Window {
	out := make([]Window, 0, len(ws))
	for _, w := range ws {
		out = append(out, *w)
	}
	slices.SortFunc(out, func(a, b Window) int { return cmp.Compare(a.Minute, b.Minute) })
	return out
}
