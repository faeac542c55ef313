package natsapi

import (
	"testing"
	"time"
)

// TestRoomAdmitsWhatThePaceReachesInTime: the queue admitted is the pace times
// roomWait, between the floor and the channel's size; the pace is measured only
// from samples in which the queue never ran dry.
func TestRoomAdmitsWhatThePaceReachesInTime(t *testing.T) {
	at := time.Date(2026, 12, 7, 23, 0, 0, 0, time.UTC)
	w := newWaitingRoom(4096, at)
	if got, want := w.capacity(roomWait), int(roomFirstRate*roomWait.Seconds()); got != want {
		t.Fatalf("capacity before any sample %d, want %d (the assumed pace)", got, want)
	}
	// Four samples of 100 requests in a quarter second, the queue never dry:
	// the pace converges on 400 a second.
	for range 4 {
		for range 100 {
			at = at.Add(roomSample / 100)
			w.done(10, at)
		}
	}
	if p := w.pace(); p < 395 || p > 420 {
		t.Fatalf("pace %.0f/s after 400/s with a queue, want about 400", p)
	}
	if c := w.capacity(roomWait); !w.admit(c-1, time.Time{}, at) || w.admit(c, time.Time{}, at) {
		t.Fatalf("capacity %d not the admission bound without a deadline", c)
	}
	// A requester that waits 10 s more may wait 5 s in the queue: about 2,000 at 400/s.
	if d, c := at.Add(10*time.Second), int(w.pace()*5); !w.admit(c-1, d, at) || w.admit(c, d, at) {
		t.Fatalf("a 10 s deadline's queue is not half of it at the pace %.0f/s", w.pace())
	}
	// One whose deadline has passed, or is about to, gets the floor.
	if !w.admit(roomFloor-1, at.Add(-time.Second), at) || w.admit(roomFloor, at.Add(-time.Second), at) {
		t.Fatal("an expired requester's queue is not the floor")
	}
	// A dry sample (the queue empty: demand, not pace) leaves the pace alone.
	before := w.pace()
	at = at.Add(roomSample)
	w.done(0, at)
	at = at.Add(roomSample)
	w.done(0, at)
	if w.pace() != before {
		t.Fatalf("pace %.0f after a dry sample, was %.0f", w.pace(), before)
	}
	// The bounds: a channel smaller than the pace's queue, and a crawl.
	small := newWaitingRoom(100, at)
	if small.capacity(roomWait) != 100 {
		t.Fatalf("capacity %d above the channel's 100", small.capacity(roomWait))
	}
	slow := newWaitingRoom(4096, at)
	slow.rate = roomMinRate
	if slow.capacity(roomWait) != roomFloor {
		t.Fatalf("capacity %d at a crawl, want the floor %d", slow.capacity(roomWait), roomFloor)
	}
}

// TestRoomSlotsFollowTheQueue: each request turned away is given its own slot, one
// request's time after the queue ahead and every slot given before; slots already
// past are not reused; none is further than longest.
func TestRoomSlotsFollowTheQueue(t *testing.T) {
	at := time.Date(2026, 12, 7, 23, 0, 0, 0, time.UTC)
	w := newWaitingRoom(4096, at)
	w.rate = 1000 / slotHaste // slots a millisecond a request apart
	if d := w.slot(1000, at); d != 1001*time.Millisecond {
		t.Fatalf("first slot behind a queue of 1000 in %s, want 1.001s", d)
	}
	if d := w.slot(1000, at); d != 1002*time.Millisecond {
		t.Fatalf("second slot in %s, want 1.002s", d)
	}
	// Half a second on, 400 left in the queue: the slots continue after those
	// given, not at the queue's end.
	at = at.Add(500 * time.Millisecond)
	if d := w.slot(400, at); d != 503*time.Millisecond {
		t.Fatalf("third slot in %s, want 503ms (after the second, due at 1.002s)", d)
	}
	// A queue longer than the slots given: after the queue.
	if d := w.slot(1000, at); d != 1001*time.Millisecond {
		t.Fatalf("slot behind a queue grown to 1000 in %s, want 1.001s", d)
	}
	// Long after, an empty queue: the next slot is one request's time away.
	at = at.Add(time.Minute)
	if d := w.slot(0, at); d != time.Millisecond {
		t.Fatalf("slot with nothing ahead in %s, want 1ms", d)
	}
	// A crowd beyond longest is told longest, and asks again then.
	w.rate = roomMinRate
	for range 10000 {
		if d := w.slot(4096, at); d > roomLongest {
			t.Fatalf("slot in %s, beyond %s", d, roomLongest)
		}
	}
	if d := w.slot(4096, at); d != roomLongest {
		t.Fatalf("slot of a crowd of 10,000 at 20/s in %s, want %s", d, roomLongest)
	}
}
