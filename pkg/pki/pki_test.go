package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/testkit"
)

func TestKeysRoundTripEveryAlgAndEncoding(t *testing.T) {
	for _, alg := range []KeyAlg{ECP256, ECP384, RSA2048} {
		for _, pkcs8 := range []bool{false, true} {
			t.Run(string(alg), func(t *testing.T) {
				k, err := GenerateKey(alg)
				if err != nil {
					t.Fatal(err)
				}
				got, err := AlgOf(k.Public())
				if err != nil || got != alg {
					t.Fatalf("AlgOf = %v %v", got, err)
				}
				p, err := EncodeKeyPEM(k, pkcs8)
				if err != nil {
					t.Fatal(err)
				}
				back, err := ParseKeyPEM(p)
				if err != nil {
					t.Fatal(err)
				}
				if a, _ := AlgOf(back.Public()); a != alg {
					t.Fatalf("parsed alg %v", a)
				}
			})
		}
	}
}

func TestAlgOfRejectsWeakKeys(t *testing.T) {
	k, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	if _, err := AlgOf(k.Public()); !errors.Is(err, ErrWeakKey) {
		t.Fatalf("P-224 accepted: %v", err)
	}
	if _, err := ParseKeyAlg("dsa"); err == nil {
		t.Fatal("unknown alg accepted")
	}
}

func TestWorkloadID(t *testing.T) {
	tests := []struct {
		name, td, ns, sa, want string
		ok                     bool
	}{
		{"ok", "cluster.local", "default", "web", "spiffe://cluster.local/ns/default/sa/web", true},
		{"bad td", "Cluster Local", "default", "web", "", false},
		{"empty ns", "cluster.local", "", "web", "", false},
		{"slash in sa", "cluster.local", "default", "a/b", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := WorkloadID(tt.td, tt.ns, tt.sa)
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v", err)
			}
			if tt.ok && id.String() != tt.want {
				t.Fatalf("id = %s", id)
			}
		})
	}
	td, ns, sa, err := ParseWorkloadID("spiffe://cluster.local/ns/default/sa/web")
	if err != nil || td != "cluster.local" || ns != "default" || sa != "web" {
		t.Fatalf("parse = %q %q %q %v", td, ns, sa, err)
	}
	for _, bad := range []string{"spiffe://td/ns/a", "spiffe://td/ns/a/sa/b/c", "https://td/ns/a/sa/b", "spiffe://td/x/a/sa/b"} {
		if _, _, _, err := ParseWorkloadID(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestCSRAndProof(t *testing.T) {
	k, _ := GenerateKey(ECP256)
	p, err := NewCSR(k, "spiffe://cluster.local/ns/default/sa/web")
	if err != nil {
		t.Fatal(err)
	}
	csr, err := ParseCSR(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(csr.URIs) != 1 || csr.URIs[0].String() != "spiffe://cluster.local/ns/default/sa/web" {
		t.Fatalf("uris %v", csr.URIs)
	}
	// A CSR whose signature does not verify is rejected.
	b, _ := pem.Decode(p)
	b.Bytes[len(b.Bytes)-3] ^= 0xff
	if _, err := ParseCSR(pem.EncodeToMemory(b)); err == nil {
		t.Fatal("tampered CSR accepted")
	}
	for _, bad := range [][]byte{nil, []byte("garbage"), append(append([]byte{}, p...), []byte("junk")...)} {
		if _, err := ParseCSR(bad); err == nil {
			t.Errorf("CSR %q accepted", bad)
		}
	}
	sig, err := SignProof(k, csr.Raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyProof(k.Public(), csr.Raw, sig); err != nil {
		t.Fatal(err)
	}
	other, _ := GenerateKey(ECP256)
	if err := VerifyProof(other.Public(), csr.Raw, sig); err == nil {
		t.Fatal("proof verified with the wrong key")
	}
}

func TestParseCertsPEM(t *testing.T) {
	if _, err := ParseCertsPEM([]byte("-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n")); err == nil {
		t.Fatal("key accepted as certificate")
	}
	if _, err := ParseCertsPEM(nil); err == nil {
		t.Fatal("empty accepted")
	}
	c := testkit.SelfSigned(t, testkit.Spec{IsCA: true, Serial: big.NewInt(0xabc)}).Cert
	bundle := EncodeCertsPEM([]*x509.Certificate{c, c})
	got, err := ParseCertsPEM(bundle)
	if err != nil || len(got) != 2 || Fingerprint(got[1]) != Fingerprint(c) || SerialHex(got[0]) != "abc" {
		t.Fatalf("round trip: %d certs, %v", len(got), err)
	}
	if _, err := ParseCertPEMs(append(CertPEMs(got), "junk")); err == nil {
		t.Fatal("junk entry accepted")
	}
}

func TestEndorsement(t *testing.T) {
	root, rootKey := testRoot(t)
	other, otherKey := testRoot(t)
	msg := []byte("bundle bytes")
	id, sig, err := Endorse(rootKey, msg)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyEndorsement([]*x509.Certificate{other, root}, msg, id, sig, nil); err != nil {
		t.Fatalf("verify under the signing root: %v", err)
	}
	for _, tc := range []struct {
		name    string
		trusted []*x509.Certificate
		msg     []byte
		sig     string
	}{
		{"untrusted key", []*x509.Certificate{other}, msg, sig},
		{"changed bytes", []*x509.Certificate{root}, []byte("bundle bytez"), sig},
		{"garbage signature", []*x509.Certificate{root}, msg, "!!"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := VerifyEndorsement(tc.trusted, tc.msg, id, tc.sig, nil); err == nil {
				t.Fatal("verified")
			}
		})
	}
	oid, osig, _ := Endorse(otherKey, msg)
	if err := VerifyEndorsement([]*x509.Certificate{root}, msg, oid, osig, nil); !errors.Is(err, ErrNotEndorsed) {
		t.Fatalf("foreign key: %v", err)
	}
}

// testRoot makes a self-signed P-256 CA certificate.
func testRoot(t *testing.T) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	ca := testkit.NewCA(t, "root", nil, time.Now(), time.Hour)
	return ca.Cert, ca.Key
}

// TestEncodePEMIsEncodingPEM: the one-allocation encoder writes what
// encoding/pem writes, for every length across several lines.
func TestEncodePEMIsEncodingPEM(t *testing.T) {
	der := make([]byte, 300)
	for i := range der {
		der[i] = byte(i * 7)
	}
	for n := range len(der) + 1 {
		want := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der[:n]})
		if got := encodePEM("CERTIFICATE", der[:n]); string(got) != string(want) || cap(got) != len(got) {
			t.Fatalf("%d bytes: got %q (cap %d), want %q", n, got, cap(got), want)
		}
	}
}
