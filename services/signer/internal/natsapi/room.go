package natsapi

import (
	"sync"
	"time"
)

// waitingRoom decides what a sign request that arrives finds: a place in the
// workers' queue, or a slot to come back at. A storm sends more requests at once
// than the signer can answer before their requesters' deadlines; silence (NATS
// dropping what does not fit) made each of those wait out its whole timeout and
// come back with the rest of the crowd, and a long queue made the workers sign for
// requesters that had already given up. Instead the room admits to the queue only
// what the workers will reach within Wait at the pace they are working, and hands
// each request it turns away a slot of its own after everything ahead of it: the
// crowd comes back spread at that pace, told so in one reply each (retry-after).
// A request that carries its requester's deadline may wait up to half of the time
// it has left (the other half for a pace that falls, and for the answer's way
// back); one without, wait.
//
// The pace is measured: requests answered per second (from admission to answer,
// the store of their record included), while there was a queue to work from (an
// idle signer's pace says nothing about what it can do).
type waitingRoom struct {
	// Wait is how long the queue may take to reach a request at the pace measured;
	// Max caps the queue whatever the pace; Floor is the smallest queue admitted
	// however slow the pace looks.
	wait       time.Duration
	max, floor int
	// longest caps a slot: a pod told to come back later than this would find the
	// signer's pace changed; it asks again and gets a fresh slot.
	longest time.Duration

	mu sync.Mutex
	// next is the last slot handed out.
	next time.Time
	// rate is the pace, requests per second (exponentially averaged per sample).
	rate float64
	// The current sample: its start, the requests finished in it, and whether the
	// queue ran dry during it.
	sampleAt time.Time
	finished int
	dry      bool
}

// Room defaults: a queue the workers reach within two seconds (a pod's sign
// request waits ten), a sample of a quarter second, and an assumed pace until one
// is measured that a two-core signer keeps on a busy machine.
const (
	roomWait      = 2 * time.Second
	roomFloor     = 64
	roomLongest   = 2 * time.Minute
	roomSample    = 250 * time.Millisecond
	roomFirstRate = 500.0
	roomMinRate   = 20.0
	slotHaste     = 1.25
)

func newWaitingRoom(max int, now time.Time) *waitingRoom {
	return &waitingRoom{wait: roomWait, max: max, floor: min(roomFloor, max), longest: roomLongest, rate: roomFirstRate, sampleAt: now}
}

// admit reports whether a request whose requester waits until deadline (zero:
// not said) may join a queue of queued: true while the workers reach it, at the
// measured pace, within wait or half of the time it has left.
func (w *waitingRoom) admit(queued int, deadline, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sample(queued, now)
	within := w.wait
	if !deadline.IsZero() {
		within = deadline.Sub(now) / 2
	}
	return queued < w.capacity(within)
}

// capacity is the longest queue admitted for a request that may wait within.
func (w *waitingRoom) capacity(within time.Duration) int {
	return min(w.max, max(w.floor, int(w.rate*within.Seconds())))
}

// slot hands a request turned away from a queue of queued its time to come back:
// after the queue and every slot handed out before, one request's time apart.
func (w *waitingRoom) slot(queued int, now time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sample(queued, now)
	// A little faster than measured: a pace that rises (the machine's other work
	// done) finds the crowd back already; one that holds turns a few away again.
	per := time.Duration(float64(time.Second) / (w.rate * slotHaste))
	// The queue ahead, then every earlier slot not yet come.
	start := now.Add(time.Duration(queued) * per)
	if w.next.Before(start) {
		w.next = start
	}
	w.next = w.next.Add(per)
	if d := w.next.Sub(now); d < w.longest {
		return d
	}
	w.next = now.Add(w.longest)
	return w.longest
}

// done counts a request a worker finished; queued is what waits after it.
func (w *waitingRoom) done(queued int, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.finished++
	w.sample(queued, now)
}

// sample closes the current sample when it is old enough, folding its pace into
// rate unless the queue ran dry in it; queued is the queue now.
func (w *waitingRoom) sample(queued int, now time.Time) {
	if queued == 0 {
		w.dry = true
	}
	el := now.Sub(w.sampleAt)
	if el < roomSample {
		return
	}
	if !w.dry && w.finished > 0 {
		w.rate = max(roomMinRate, 0.5*w.rate+0.5*float64(w.finished)/el.Seconds())
	}
	w.sampleAt, w.finished, w.dry = now, 0, queued == 0
}

// pace is the measured pace, requests per second.
func (w *waitingRoom) pace() float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rate
}
