package identity

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

// chainFor returns the PEMs of a leaf with the given URI SANs and its root.
func chainFor(t *testing.T, uris ...string) []string {
	t.Helper()
	root := testkit.NewCA(t, "root", nil, time.Now(), time.Hour)
	spec := testkit.Spec{Name: "leaf"}
	if len(uris) > 0 {
		spec.ID, spec.URIs = uris[0], uris[1:]
	}
	return pki.CertPEMs([]*x509.Certificate{root.Issue(t, spec).Cert, root.Cert})
}

func TestCheckChainWantsExactlyOurSPIFFEID(t *testing.T) {
	const own = "spiffe://cluster.local/ns/default/sa/web"
	tests := []struct {
		name    string
		uris    []string
		want    string
		wantErr string
	}{
		{name: "own identity", uris: []string{own}, want: own},
		{name: "another identity", uris: []string{"spiffe://cluster.local/ns/kube-system/sa/admin"}, want: own, wantErr: "not " + own},
		{name: "own as a prefix", uris: []string{own + "x"}, want: own, wantErr: "not " + own},
		{name: "another trust domain", uris: []string{"spiffe://evil.example/ns/default/sa/web"}, want: own, wantErr: "not " + own},
		{name: "own plus another", uris: []string{own, "spiffe://cluster.local/ns/default/sa/db"}, want: own, wantErr: "not " + own},
		{name: "no uri san", want: own, wantErr: "not " + own},
		{name: "nothing to check against", uris: []string{own}, wantErr: "no spiffe id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			chain, err := checkChain(chainFor(t, tc.uris...), tc.want)
			if tc.wantErr == "" {
				if err != nil || len(chain) != 2 {
					t.Fatalf("checkChain = %d certs, %v; want the chain", len(chain), err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("checkChain error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// Every chain shape the signer returns across a rotation to a new key passes
// checkChain (phase 2's [leaf, cross, new root] failed with "chain[1] not signed by
// chain[2]" and left the pod on an expiring certificate); a chain whose CA
// certificates neither sign nor share a key with the next does not.
func TestCheckChainTakesEveryRotationPhase(t *testing.T) {
	const own = "spiffe://cluster.local/ns/default/sa/web"
	rot := testkit.NewRotation(t, time.Now(), time.Hour)
	for phase := testkit.PhaseBefore; phase <= testkit.PhaseSettled; phase++ {
		leaf := rot.Signer(phase).Issue(t, testkit.Spec{ID: own})
		pems := pki.CertPEMs(append([]*x509.Certificate{leaf.Cert}, rot.Above(phase)...))
		if chain, err := checkChain(pems, own); err != nil || len(chain) != len(pems) {
			t.Errorf("phase %d: checkChain = %d certs, %v", phase, len(chain), err)
		}
	}
	other := testkit.NewCA(t, "meshagent root CA", nil, time.Now(), time.Hour)
	leaf := rot.New.Issue(t, testkit.Spec{ID: own})
	for name, above := range map[string][]*x509.Certificate{
		"cross then an unrelated root":      {rot.Cross, other.Cert},
		"leaf under the old key's position": {rot.Old.Cert, rot.Cross},
		"new root then the cross":           {rot.New.Cert, rot.Cross, other.Cert},
	} {
		pems := pki.CertPEMs(append([]*x509.Certificate{leaf.Cert}, above...))
		if _, err := checkChain(pems, own); err == nil || !strings.Contains(err.Error(), "not signed by") {
			t.Errorf("%s: checkChain error %v, want a refusal", name, err)
		}
	}
}
