package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
)

// chainFor returns the PEMs of a leaf with the given URI SANs and its root.
func chainFor(t *testing.T, uris ...string) []string {
	t.Helper()
	rk, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	rt := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	rder, err := x509.CreateCertificate(rand.Reader, rt, rt, rk.Public(), rk)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := x509.ParseCertificate(rder)
	lt := &x509.Certificate{SerialNumber: big.NewInt(2), NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		lt.URIs = append(lt.URIs, pu)
	}
	lk, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	lder, err := x509.CreateCertificate(rand.Reader, lt, root, lk.Public(), rk)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(lder)
	return pki.CertPEMs([]*x509.Certificate{leaf, root})
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
