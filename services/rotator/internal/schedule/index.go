package schedule

import "hash/maphash"

// index finds an entry by key. It is an open-addressing hash table (linear
// probing, backward-shift deletion) of 8-byte slots: the key's 32-bit hash, which
// also gives its home slot, and the entry's position + 1. Keys are compared in
// the entries slice only when the hashes match, and growing never rehashes a key.
// That is 8 bytes a slot instead of a Go map[string]int32's ~40 bytes an entry:
// about a fifth of the schedule's memory at a million entries.
type index struct {
	s     *Schedule
	seed  maphash.Seed
	slots []uint64
	n     int
}

func slot(h uint32, e int32) uint64 { return uint64(h)<<32 | uint64(uint32(e+1)) }
func slotHash(v uint64) uint32      { return uint32(v >> 32) }
func slotPos(v uint64) int32        { return int32(uint32(v)) - 1 }

func (x *index) hash(k string) uint32 { return uint32(maphash.String(x.seed, k)) }

// find returns the slot holding k, or -1.
func (x *index) find(k string) int {
	if len(x.slots) == 0 {
		return -1
	}
	h := x.hash(k)
	mask := len(x.slots) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		v := x.slots[i]
		if v == 0 {
			return -1
		}
		if slotHash(v) == h && x.s.entries[slotPos(v)].key == k {
			return i
		}
	}
}

func (x *index) get(k string) (int32, bool) {
	if p := x.find(k); p >= 0 {
		return slotPos(x.slots[p]), true
	}
	return 0, false
}

// put adds k (not present) at entry position e.
func (x *index) put(k string, e int32) {
	if (x.n+1)*4 > len(x.slots)*3 {
		x.grow()
	}
	x.insert(slot(x.hash(k), e))
	x.n++
}

func (x *index) insert(v uint64) {
	mask := len(x.slots) - 1
	i := int(slotHash(v)) & mask
	for x.slots[i] != 0 {
		i = (i + 1) & mask
	}
	x.slots[i] = v
}

func (x *index) grow() {
	old := x.slots
	x.slots = make([]uint64, max(64, 2*len(old)))
	for _, v := range old {
		if v != 0 {
			x.insert(v)
		}
	}
}

// move records that key k now lives at entry position e.
func (x *index) move(k string, e int32) {
	if p := x.find(k); p >= 0 {
		x.slots[p] = slot(slotHash(x.slots[p]), e)
	}
}

// del removes k, shifting later members of its probe run back.
func (x *index) del(k string) {
	p := x.find(k)
	if p < 0 {
		return
	}
	mask := len(x.slots) - 1
	x.slots[p] = 0
	x.n--
	for j := (p + 1) & mask; x.slots[j] != 0; j = (j + 1) & mask {
		h := int(slotHash(x.slots[j])) & mask
		// Move slot j back to p unless its home lies cyclically in (p, j].
		if (p < j && (h <= p || h > j)) || (p > j && h <= p && h > j) {
			x.slots[p], x.slots[j] = x.slots[j], 0
			p = j
		}
	}
}
