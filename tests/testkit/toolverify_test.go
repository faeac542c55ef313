package testkit

import (
	"crypto/x509"
	"testing"
	"time"
)

// OpenSSLVerifies takes every chain a new-key rotation serves under the trust that
// holds then, and refuses the ones it must: a phase-3 chain under the old root alone,
// and any chain under an unrelated root.
func TestOpenSSLVerifiesEveryPhaseAndRefusesWhatItMust(t *testing.T) {
	now := time.Now()
	r := NewRotation(t, now, 24*time.Hour)
	other := NewCA(t, "meshagent root CA", nil, now, time.Hour)
	old := []*x509.Certificate{r.Old.Cert}
	for phase := PhaseBefore; phase <= PhaseSettled; phase++ {
		leaf := r.Signer(phase).Issue(t, Spec{ID: "spiffe://cluster.local/ns/a/sa/b"})
		chain := append([]*x509.Certificate{leaf.Cert}, r.Above(phase)...)
		if err := OpenSSLVerifies(t, chain, r.Bundle(phase)); err != nil {
			t.Errorf("phase %d under its bundle: %v", phase, err)
		}
		err := OpenSSLVerifies(t, chain, old)
		if phase == PhaseSettled {
			if err == nil {
				t.Errorf("phase %d: [leaf, new root] verified under the old root alone", phase)
			}
		} else if err != nil {
			t.Errorf("phase %d under the old root alone: %v", phase, err)
		}
		if err := OpenSSLVerifies(t, chain, []*x509.Certificate{other.Cert}); err == nil {
			t.Errorf("phase %d verified under an unrelated root of the same name", phase)
		}
	}
}
