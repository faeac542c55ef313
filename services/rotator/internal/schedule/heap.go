package schedule

// where an entry is queued.
const (
	inNone    uint8 = iota
	inPending       // waiting for its due time, ordered by due
	inReady         // due, waiting for the rate limit, ordered by expiry
)

// queue is a binary min-heap of entry indices. Each entry records its position
// (hidx) so that it can be removed or fixed in O(log n).
type queue struct {
	s     *Schedule
	which uint8
	idx   []int32
}

func (q *queue) less(a, b int32) bool {
	ea, eb := &q.s.entries[a], &q.s.entries[b]
	if q.which == inPending {
		if ea.due != eb.due {
			return ea.due < eb.due
		}
		return ea.notAfter < eb.notAfter
	}
	if ea.notAfter != eb.notAfter {
		return ea.notAfter < eb.notAfter
	}
	return ea.due < eb.due
}

func (q *queue) swap(i, j int) {
	q.idx[i], q.idx[j] = q.idx[j], q.idx[i]
	q.s.entries[q.idx[i]].hidx = int32(i)
	q.s.entries[q.idx[j]].hidx = int32(j)
}

func (q *queue) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !q.less(q.idx[j], q.idx[i]) {
			break
		}
		q.swap(i, j)
		j = i
	}
}

func (q *queue) down(i int) bool {
	i0, n := i, len(q.idx)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		j := l
		if r := l + 1; r < n && q.less(q.idx[r], q.idx[l]) {
			j = r
		}
		if !q.less(q.idx[j], q.idx[i]) {
			break
		}
		q.swap(i, j)
		i = j
	}
	return i > i0
}

func (q *queue) push(e int32) {
	q.s.entries[e].which = q.which
	q.s.entries[e].hidx = int32(len(q.idx))
	q.idx = append(q.idx, e)
	q.up(len(q.idx) - 1)
}

func (q *queue) top() (int32, bool) {
	if len(q.idx) == 0 {
		return 0, false
	}
	return q.idx[0], true
}

func (q *queue) remove(e int32) {
	i := int(q.s.entries[e].hidx)
	n := len(q.idx) - 1
	if i != n {
		q.swap(i, n)
	}
	q.idx = q.idx[:n]
	if i != n && !q.down(i) {
		q.up(i)
	}
	q.s.entries[e].which = inNone
	q.s.entries[e].hidx = -1
}

func (q *queue) fix(e int32) {
	i := int(q.s.entries[e].hidx)
	if !q.down(i) {
		q.up(i)
	}
}
