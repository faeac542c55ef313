package issuer

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
)

// AnswerWindow is how long a recorded certificate answers a repeat of the request
// that got it. It outlasts a requester's timeout and its wait before the retry
// (sds-edge: a 10 s request timeout and at most a second after a timeout).
const AnswerWindow = time.Minute

// maxAnswers bounds the answers kept: past it the oldest is forgotten first, and a
// repeat of its request is signed anew, as without them.
const maxAnswers = 1 << 14

// answers keeps, for AnswerWindow, each certificate this replica issued under the
// mesh CA and recorded, by what it was issued for. A requester that gave up just
// as its certificate was signed (an overloaded signer answered after the
// requester's timeout) asks again with the same CSR: it is given the certificate
// already recorded for it, so that a lost answer costs no second certificate, no
// second pair of writes and no early-certificate count. Per replica: a repeat that
// reaches another replica is signed there, as before.
//
// An answer is the leaf's DER and the material that signed it, nothing the garbage
// collector has to walk: 16,384 parsed certificates held for a minute cost the
// signer ~5 % more CPU per CSR (BenchmarkSignRealBinaryBusID).
type answers struct {
	mu    sync.Mutex
	by    map[answerKey]answer
	order []answerAt // oldest first, from head
	head  int
}

// answerKey is the hash of everything a certificate's content depends on besides
// the time and the CA material (kept in the answer): who it is for (the holder and
// the identity proved), the CSR (same CSR, same key), the lifetime and the resource.
type answerKey [sha256.Size]byte

func newAnswerKey(holder, id, resource string, ttl time.Duration, csrDER []byte) answerKey {
	h := sha256.New()
	for _, s := range []string{holder, id, resource} {
		h.Write(binary.AppendUvarint(nil, uint64(len(s))))
		h.Write([]byte(s))
	}
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(ttl)))
	h.Write(csrDER)
	var k answerKey
	h.Sum(k[:0])
	return k
}

// answer is a recorded certificate: its DER and the material that signed it (a
// repeat under other material is a new request: a root rotation in between asks
// for a certificate of the new root).
type answer struct {
	der []byte
	mat *ca.Material
}

type answerAt struct {
	key answerKey
	at  time.Time
}

// get returns the certificate recorded for k under mat within AnswerWindow of now,
// as the Result it was first answered with.
func (a *answers) get(k answerKey, mat *ca.Material, now time.Time) (Result, bool) {
	a.mu.Lock()
	a.forget(now)
	ans, ok := a.by[k]
	a.mu.Unlock()
	if !ok || ans.mat != mat {
		return Result{}, false
	}
	leaf, err := x509.ParseCertificate(ans.der)
	if err != nil { // it parsed when it was signed
		return Result{}, false
	}
	return meshResult(leaf, string(pki.EncodeCertPEM(leaf)), mat), true
}

// put keeps leaf, signed under mat and recorded at now, as the answer to k.
func (a *answers) put(k answerKey, leaf *x509.Certificate, mat *ca.Material, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forget(now)
	if a.by == nil {
		a.by = map[answerKey]answer{}
	}
	if _, ok := a.by[k]; ok {
		return // the first answer stays (two requests in flight at once)
	}
	if len(a.by) >= maxAnswers {
		a.drop()
	}
	a.by[k] = answer{der: leaf.Raw, mat: mat}
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
	a.head++
	if a.head == len(a.order) {
		a.order, a.head = a.order[:0], 0
	} else if a.head > len(a.order)/2 { // keep the slice from growing without end
		a.order, a.head = append(a.order[:0], a.order[a.head:]...), 0
	}
}
