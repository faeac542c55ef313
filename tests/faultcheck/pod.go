package faultcheck

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/testkit"
)

// Served is what a pod's SDS socket serves at one moment, as Envoy would hold it.
type Served struct {
	Leaf  *x509.Certificate // nil before the first `default`
	Chain []*x509.Certificate
	Key   crypto.Signer       // the leaf's key, as Envoy gets it (nil if it did not parse)
	Roots []*x509.Certificate // ROOTCA
}

// Serial is the served leaf's serial (hex), "" when none.
func (s Served) Serial() string {
	if s.Leaf == nil {
		return ""
	}
	return pki.SerialHex(s.Leaf)
}

// ChainsTo reports whether the served leaf verifies, through its chain, to one of
// roots at time at.
func (s Served) ChainsTo(roots []*x509.Certificate, at time.Time) error {
	if s.Leaf == nil {
		return errors.New("no certificate served")
	}
	pool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	for _, c := range s.Chain[1:] {
		inter.AddCert(c)
	}
	_, err := s.Leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: at,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

// HoldsAll reports whether the served ROOTCA includes every certificate of want.
func (s Served) HoldsAll(want []*x509.Certificate) bool {
	for _, w := range want {
		found := false
		for _, c := range s.Roots {
			found = found || c.Equal(w)
		}
		if !found {
			return false
		}
	}
	return len(want) > 0
}

// Sample is one look at the pod: what it served, whether an SDS stream was open,
// and what its /readyz said (0: it did not answer, or no URL).
type Sample struct {
	At    time.Time
	Cur   Served
	Up    bool
	Ready int
}

// Expired reports whether the sample shows a certificate served past its expiry.
func (s Sample) Expired() bool { return s.Cur.Leaf != nil && !s.At.Before(s.Cur.Leaf.NotAfter) }

// PodWatch watches a pod as its Envoy would: one StreamSecrets stream for `default`
// and ROOTCA over the SDS socket, reopened when it breaks, and /readyz, sampled
// every Every. Figures drawn from it are good to about Every.
type PodWatch struct {
	Every time.Duration

	socket, node, readyURL string

	mu      sync.Mutex
	cur     Served
	up      bool
	samples []Sample
	first   map[string]time.Time // serial -> when it was first pushed
}

// WatchPod starts watching the SDS socket at socket as node id node, and readyURL
// ("" for none), until ctx ends.
func WatchPod(ctx context.Context, socket, node, readyURL string, every time.Duration) *PodWatch {
	w := &PodWatch{Every: every, socket: socket, node: node, readyURL: readyURL, first: map[string]time.Time{}}
	go w.watch(ctx)
	go w.sample(ctx)
	return w
}

func (w *PodWatch) watch(ctx context.Context) {
	for ctx.Err() == nil {
		w.stream(ctx)
		w.mu.Lock()
		w.up = false
		w.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(w.Every):
		}
	}
}

// stream holds one SDS stream until it breaks.
func (w *PodWatch) stream(ctx context.Context) {
	cc, err := sdsclient.DialUnix(ctx, w.socket)
	if err != nil {
		return
	}
	defer cc.Close()
	st, err := sdsclient.Open(ctx, cc, w.node, "default", "ROOTCA")
	if err != nil {
		return
	}
	defer st.Close()
	for {
		u, err := st.Recv()
		if err != nil {
			return
		}
		w.mu.Lock()
		w.up = true
		for _, s := range u.Secrets {
			switch {
			case s.IsCertificate():
				if cs, err := pki.ParseCertsPEM(s.CertChain); err == nil && len(cs) > 0 {
					w.cur.Leaf, w.cur.Chain = cs[0], cs
					w.cur.Key, _ = pki.ParseKeyPEM(s.PrivateKey)
					if _, ok := w.first[w.cur.Serial()]; !ok {
						w.first[w.cur.Serial()] = time.Now()
					}
				}
			case s.IsValidationContext():
				if cs, err := pki.ParseCertsPEM(s.TrustedCA); err == nil {
					w.cur.Roots = cs
				}
			}
		}
		w.mu.Unlock()
	}
}

// ProbeTimeout bounds one /readyz probe: a pod whose status server accepts and
// does not answer (frozen, or a machine at load 30) is sampled not ready after
// it, instead of holding every later sample back.
const ProbeTimeout = 2 * time.Second

func (w *PodWatch) sample(ctx context.Context) {
	t := time.NewTicker(w.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ready := 0
		if w.readyURL != "" {
			ready, _ = testkit.HTTPGetWithin(w.readyURL, ProbeTimeout)
		}
		w.mu.Lock()
		w.samples = append(w.samples, Sample{At: time.Now(), Cur: w.cur, Up: w.up, Ready: ready})
		w.mu.Unlock()
	}
}

// Now is the pod's current state (Ready not sampled).
func (w *PodWatch) Now() Sample {
	w.mu.Lock()
	defer w.mu.Unlock()
	return Sample{At: time.Now(), Cur: w.cur, Up: w.up}
}

// Since returns the samples taken from t on.
func (w *PodWatch) Since(t time.Time) []Sample {
	w.mu.Lock()
	defer w.mu.Unlock()
	return from(w.samples, t, func(s Sample) time.Time { return s.At })
}

// from returns a copy of the items (in time order) taken at t or later.
func from[T any](items []T, t time.Time, at func(T) time.Time) []T {
	i, _ := slices.BinarySearchFunc(items, t, func(x T, t time.Time) int { return at(x).Compare(t) })
	return slices.Clone(items[i:])
}

// FirstServed is when serial was first pushed to the watch, if it was.
func (w *PodWatch) FirstServed(serial string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.first[serial]
	return at, ok
}

// ServedSince is the set of every serial first pushed from t on, even one replaced
// before a sample saw it, and of the one served at t.
func (w *PodWatch) ServedSince(t time.Time) map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]bool{}
	for sn, at := range w.first {
		if !at.Before(t) {
			out[sn] = true
		}
	}
	for _, s := range w.samples {
		if !s.At.Before(t) && s.Cur.Leaf != nil {
			out[s.Cur.Serial()] = true
			break
		}
	}
	return out
}
