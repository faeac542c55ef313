package issuer

import (
	"crypto/sha256"
	"sync"
	"time"

	"github.com/meshagent/meshagent/services/signer/internal/ca"
)

// AnswerWindow is how long a recorded certificate answers a repeat of the request
// that got it. It outlasts a requester's timeout and its wait before the retry
// (sds-edge: a 10 s request timeout and at most a second after a timeout).
const AnswerWindow = time.Minute

// maxAnswers bounds the answers kept (a few KiB each): past it the oldest is
// forgotten first, and a repeat of its request is signed anew, as without them.
const maxAnswers = 1 << 14

// answers keeps, for AnswerWindow, each certificate this replica issued and
// recorded, by what it was issued for. A requester that gave up just as its
// certificate was signed (an overloaded signer answered after the requester's
// timeout) asks again with the same CSR: it is given the certificate already
// recorded for it, so that a lost answer costs no second certificate, no second
// pair of writes and no early-certificate count. Per replica: a repeat that reaches
// another replica is signed there, as before.
type answers struct {
	mu    sync.Mutex
	by    map[answerKey]Result
	order []answerAt // oldest first, from head
	head  int
}

// answerKey is everything a certificate's content depends on besides the time: who
// it is for (the holder and the identity proved), the key (the CSR's hash: same
// CSR, same key), the lifetime and resource asked for, and the CA material it was
// signed under (a root rotation in between asks for a new one).
type answerKey struct {
	holder, id, resource string
	csr                  [sha256.Size]byte
	ttl                  time.Duration
	mat                  *ca.Material
}

type answerAt struct {
	key answerKey
	at  time.Time
}

// get returns the certificate recorded for k within AnswerWindow of now.
func (a *answers) get(k answerKey, now time.Time) (Result, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forget(now)
	res, ok := a.by[k]
	return res, ok
}

// put keeps res, recorded at now, as the answer to k.
func (a *answers) put(k answerKey, res Result, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forget(now)
	if a.by == nil {
		a.by = map[answerKey]Result{}
	}
	if _, ok := a.by[k]; ok {
		return // the first answer stays (two requests in flight at once)
	}
	if len(a.by) >= maxAnswers {
		a.drop()
	}
	a.by[k] = res
	a.order = append(a.order, answerAt{key: k, at: now})
}

// forget drops the answers older than AnswerWindow.
func (a *answers) forget(now time.Time) {
	for a.head < len(a.order) && now.Sub(a.order[a.head].at) >= AnswerWindow {
		a.drop()
	}
}

// drop forgets the oldest answer.
func (a *answers) drop() {
	delete(a.by, a.order[a.head].key)
	a.order[a.head] = answerAt{}
	a.head++
	if a.head == len(a.order) {
		a.order, a.head = a.order[:0], 0
	} else if a.head > len(a.order)/2 { // keep the slice from growing without end
		a.order, a.head = append(a.order[:0], a.order[a.head:]...), 0
	}
}
