package issuer

import (
	"sync/atomic"
	"time"
)

// A certificate is only worth signing if its answer can reach the requester before
// the requester stops waiting: after the signature come the issued record and
// cert.issued, each stored in JetStream, then the reply. A request signed with less
// time left than that gets its certificate recorded and sent to no one (a storm
// wasted 0–332 certificates a run this way, docs/scale.md). finishTime keeps how
// long that last stretch has been taking, and a request whose deadline comes sooner
// is dropped before the signature, as an expired one is.

// maxFinishMargin caps the margin: a request with more time left than this is
// always signed, so that a slow store (a stream election) can never make the signer
// drop everything, and keeps feeding the estimate.
const maxFinishMargin = 500 * time.Millisecond

// finishTime is a moving average of the time from a signature to its answer.
type finishTime struct{ ns atomic.Int64 }

// observe folds one duration in, with weight 1/8.
func (f *finishTime) observe(d time.Duration) {
	for {
		old := f.ns.Load()
		next := int64(d)
		if old != 0 {
			next = old + (int64(d)-old)/8
		}
		if f.ns.CompareAndSwap(old, next) {
			return
		}
	}
}

// margin is the time a request needs left to be signed.
func (f *finishTime) margin() time.Duration {
	return min(time.Duration(f.ns.Load()), maxFinishMargin)
}

// tooLate says whether a request with deadline d (zero: none), checked at now, has
// less time left than the margin.
func (f *finishTime) tooLate(d, now time.Time) bool {
	return !d.IsZero() && d.Sub(now) < f.margin()
}
