package issuer

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// fuzzNow is the fixed time of every fuzz iteration, so that a saved crasher replays.
var fuzzNow = time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)

// Credentials the fuzzer picks between (cred % credCount).
const (
	credToken     = iota // a valid pod-bound JWT for shop/web, pod web-0
	credCertProof        // a client certificate for x509/renewer + a proof over the CSR
	credPeer             // the same certificate as an mTLS peer chain
	credNone             // no credential at all
	credCount
)

// fuzzIssuer is an issuer over a root + intermediate CA, with a JWT verifier, a
// client certificate to renew with and a recording publisher.
type fuzzIssuer struct {
	iss        *Issuer
	root       *x509.Certificate
	inter      *x509.Certificate
	token      string
	clientKey  crypto.Signer
	clientPEMs []string
	clientPeer []*x509.Certificate
	published  []*nats.Msg
	// dir holds the CA's files, which plugged loads again on Reload; recorded, the
	// serials recorded so far.
	dir      string
	jwtIss   *tokentest.Issuer
	rootCA   *testkit.CA
	plugged  *ca.Plugged
	recorded map[string]bool
}

const (
	tokenID  = "spiffe://cluster.local/ns/shop/sa/web"
	tokenPod = "web-0"
	certID   = "spiffe://cluster.local/ns/x509/sa/renewer"
	maxTTL   = 48 * time.Hour
)

func newFuzzIssuer(f testing.TB) *fuzzIssuer {
	f.Helper()
	root := testkit.NewCA(f, "root", nil, fuzzNow, 365*24*time.Hour)
	inter := testkit.NewCA(f, "inter", root, fuzzNow, 30*24*time.Hour)
	dir := f.TempDir()
	signertest.WriteCACerts(f, dir, inter, []*x509.Certificate{root.Cert}, root.Cert)
	now := clock.NewFake(fuzzNow)
	auth := &ca.Authority{}
	plugged := ca.NewPlugged(dir, time.Second, "cluster.local", auth, nil, hclog.NewNullLogger(), now)
	if err := plugged.Start(context.Background()); err != nil {
		f.Fatal(err)
	}
	jwtIss := tokentest.NewIssuer(f, "meshagent-dev")
	verifier := &authn.JWTVerifier{Keys: authn.StaticKeySet(jwtIss.JWKS()), Issuer: "meshagent-dev", Audience: "istio-ca",
		TrustDomain: "cluster.local", Clock: now}
	fi := &fuzzIssuer{root: root.Cert, inter: inter.Cert, dir: dir, jwtIss: jwtIss, rootCA: root, plugged: plugged, recorded: map[string]bool{}}
	fi.token = jwtIss.Mint(f, jwtIss.ServiceAccount("shop", "web", fuzzNow.Add(-time.Minute), time.Hour).ForPod(tokenPod))

	// A client certificate issued by this CA, as a workload renewing with its
	// still-valid certificate has.
	k, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		f.Fatal(err)
	}
	id, _ := url.Parse(certID)
	leaf, err := auth.Current().SignLeaf(k.Public(), id, fuzzNow.Add(-time.Minute), time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	fi.clientKey = k
	fi.clientPeer = []*x509.Certificate{leaf, inter.Cert}
	fi.clientPEMs = pki.CertPEMs(fi.clientPeer)

	publish := func(_ context.Context, msg *nats.Msg) error {
		fi.published = append(fi.published, msg)
		return nil
	}
	metrics := NewMetrics(prometheus.NewRegistry(), auth, now)
	fi.iss = New(Config{TrustDomain: "cluster.local", Instance: "fuzz", DefaultTTL: 24 * time.Hour, MaxTTL: maxTTL},
		auth, verifier, publish, metrics, hclog.NewNullLogger(), now)
	return fi
}

// fuzzCSR builds a PEM CSR for tmpl signed by key.
func fuzzCSR(f *testing.F, key crypto.Signer, tmpl *x509.CertificateRequest) []byte {
	f.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		f.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func csrSeeds(f *testing.F) [][]byte {
	key := func(alg pki.KeyAlg) crypto.Signer {
		k, err := pki.GenerateKey(alg)
		if err != nil {
			f.Fatal(err)
		}
		return k
	}
	p256, p384, rsa2048 := key(pki.ECP256), key(pki.ECP384), key(pki.RSA2048)
	p224, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	uri := func(s string) []*url.URL { u, _ := url.Parse(s); return []*url.URL{u} }
	// The CSR asks for another identity, other SANs and a CA basic constraint; none
	// of it may reach the certificate.
	bc, _ := asn1.Marshal(struct {
		IsCA bool `asn1:"optional"`
	}{true})
	greedy := &x509.CertificateRequest{
		Subject:         pkix.Name{CommonName: "istiod", Organization: []string{"root"}},
		URIs:            uri("spiffe://cluster.local/ns/kube-system/sa/admin"),
		DNSNames:        []string{"istiod.istio-system.svc"},
		EmailAddresses:  []string{"admin@example.org"},
		ExtraExtensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: bc}},
	}
	good := fuzzCSR(f, p256, &x509.CertificateRequest{URIs: uri(tokenID)})
	block, _ := pem.Decode(good)
	badSig := bytes.Clone(block.Bytes)
	badSig[len(badSig)-1] ^= 0xff
	seeds := [][]byte{
		good,
		fuzzCSR(f, p384, &x509.CertificateRequest{URIs: uri("spiffe://example.org/ns/shop/sa/web")}),
		fuzzCSR(f, rsa2048, &x509.CertificateRequest{URIs: uri(certID)}),
		fuzzCSR(f, p256, greedy),
		fuzzCSR(f, p256, &x509.CertificateRequest{}),
		fuzzCSR(f, p224, &x509.CertificateRequest{URIs: uri(tokenID)}),
		fuzzCSR(f, ed, &x509.CertificateRequest{URIs: uri(tokenID)}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: badSig}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: block.Bytes}),
		append(bytes.Clone(good), good...),
		append(bytes.Clone(good), "trailing"...),
		block.Bytes,
		[]byte("-----BEGIN CERTIFICATE REQUEST-----\n-----END CERTIFICATE REQUEST-----\n"),
		nil,
		bytes.Repeat([]byte("A"), events.MaxEventSize+1),
	}
	return seeds
}

// FuzzIssue feeds arbitrary CSR bytes, TTLs and request fields to Issue with each
// kind of credential. Whatever the input: no panic; a CSR that does not parse is
// refused; a refusal is an *Error with a code and publishes nothing; and an issued
// certificate names the credential's identity (never the CSR's), is not a CA,
// carries the CSR's key, lives no longer than asked, chains to the test root and
// is recorded by exactly one cert.issued event for the same identity.
func FuzzIssue(f *testing.F) {
	fi := newFuzzIssuer(f)
	for i, csr := range csrSeeds(f) {
		cred := uint8(i % credCount)
		f.Add(csr, int64(0), cred, "", "", "")
		f.Add(csr, int64(time.Hour), uint8(credToken), "EC-P256", "default", "shop/"+tokenPod)
		f.Add(csr, int64(time.Hour), uint8(credCertProof), "", "", "")
	}
	good := csrSeeds(f)[0]
	// The harness must reach the issuing path, or the properties below check nothing.
	for cred := range credNone {
		req, via := events.SignRequest{CSR: string(good)}, Via{Transport: TransportNATS}
		switch cred {
		case credToken:
			req.Token = fi.token
		case credCertProof:
			csr, _ := pki.ParseCSR(good)
			sig, _ := pki.SignProof(fi.clientKey, csr.Raw)
			req.CertChain, req.Proof = fi.clientPEMs, base64.StdEncoding.EncodeToString(sig)
		case credPeer:
			via.PeerChain = fi.clientPeer
		}
		if _, err := fi.iss.Issue(context.Background(), req, via); err != nil {
			f.Fatalf("good CSR with credential %d: %v", cred, err)
		}
	}
	f.Add(good, int64(maxTTL+time.Second), uint8(credToken), "", "", "")
	f.Add(good, int64(1<<62), uint8(credPeer), "", "", "")
	f.Add(good, int64(-time.Second), uint8(credPeer), "rsa", "ROOTCA", "shop/web-1")
	f.Add(good, int64(time.Second), uint8(credToken), "", "default", "attacker/web-0")
	f.Add(good, int64(1), uint8(credToken), "", "", "")

	// ttl is a time.Duration: the issuer gets durations, whatever the wire did.
	f.Fuzz(func(t *testing.T, csrPEM []byte, ttlNanos int64, cred uint8, keyAlg, resource, pod string) {
		fi.published = fi.published[:0]
		ttl := time.Duration(ttlNanos)
		var podRef events.PodRef
		_ = podRef.UnmarshalText([]byte(pod)) // as the wire reads it; Issue validates
		req := events.SignRequest{CSR: string(csrPEM), TTL: ttl, KeyAlgorithm: keyAlg, Resource: resource, Pod: podRef}
		via := Via{Transport: TransportNATS}
		csr, csrErr := pki.ParseCSR(csrPEM)
		wantID := ""
		switch cred % credCount {
		case credToken:
			req.Token, wantID = fi.token, tokenID
		case credCertProof:
			req.CertChain, wantID = fi.clientPEMs, certID
			req.Proof = base64.StdEncoding.EncodeToString([]byte("not a signature"))
			if csrErr == nil {
				sig, err := pki.SignProof(fi.clientKey, csr.Raw)
				if err != nil {
					t.Fatal(err)
				}
				req.Proof = base64.StdEncoding.EncodeToString(sig)
			}
		case credPeer:
			via.PeerChain, wantID = fi.clientPeer, certID
		}

		res, err := fi.iss.Issue(context.Background(), req, via)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code == "" {
				t.Fatalf("error %v (%T) is not an *Error with a code", err, err)
			}
			if res.Leaf != nil || len(res.Chain) > 0 {
				t.Fatalf("error %v came with a certificate", err)
			}
			if len(fi.published) != 0 {
				t.Fatalf("refused request published %d events", len(fi.published))
			}
			return
		}

		// Issued: everything below must hold.
		if csrErr != nil {
			t.Fatalf("issued a certificate for a CSR that does not parse: %v", csrErr)
		}
		if wantID == "" {
			t.Fatal("issued a certificate without a credential")
		}
		leaf := res.Leaf
		if len(leaf.URIs) != 1 || leaf.URIs[0].String() != wantID {
			t.Fatalf("leaf URI SANs %v, want only %s (the credential's identity)", leaf.URIs, wantID)
		}
		if len(leaf.DNSNames)+len(leaf.EmailAddresses)+len(leaf.IPAddresses) != 0 || leaf.Subject.String() != "" {
			t.Fatalf("leaf carries names from the CSR: subject %q dns %v email %v ip %v", leaf.Subject, leaf.DNSNames, leaf.EmailAddresses, leaf.IPAddresses)
		}
		if leaf.IsCA || !leaf.BasicConstraintsValid || leaf.KeyUsage&x509.KeyUsageCertSign != 0 {
			t.Fatalf("leaf may act as a CA: isCA %v bc %v usage %b", leaf.IsCA, leaf.BasicConstraintsValid, leaf.KeyUsage)
		}
		type equaler interface{ Equal(crypto.PublicKey) bool }
		if pub, ok := leaf.PublicKey.(equaler); !ok || !pub.Equal(csr.PublicKey) {
			t.Fatal("leaf key is not the CSR's key")
		}
		if ttl > maxTTL {
			t.Fatalf("issued for TTL %s over the max %s", ttl, maxTTL)
		}
		if leaf.NotAfter.After(fuzzNow.Add(maxTTL)) || (ttl > 0 && leaf.NotAfter.After(fuzzNow.Add(ttl))) {
			t.Fatalf("leaf not_after %s: longer than TTL %s allows", leaf.NotAfter, ttl)
		}
		roots, inters := x509.NewCertPool(), x509.NewCertPool()
		roots.AddCert(fi.root)
		inters.AddCert(fi.inter)
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, CurrentTime: fuzzNow,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Fatalf("leaf does not chain to the test root: %v", err)
		}
		chain, err := pki.ParseCertPEMs(res.Chain)
		if err != nil || len(chain) < 2 || !chain[0].Equal(leaf) || !chain[len(chain)-1].Equal(fi.root) {
			t.Fatalf("reply chain is not leaf..root (%d certs, %v)", len(chain), err)
		}
		// A certificate is recorded once: a request repeated within AnswerWindow is
		// answered with the certificate recorded for it, and writes nothing.
		serial := pki.SerialHex(leaf)
		if len(fi.published) == 0 {
			if !fi.recorded[serial] {
				t.Fatalf("certificate %s answered without being recorded", serial)
			}
			return
		}
		if fi.recorded[serial] {
			t.Fatalf("certificate %s recorded twice", serial)
		}
		fi.recorded[serial] = true
		if len(fi.published) != 1 {
			t.Fatalf("issued certificate recorded by %d events, want 1", len(fi.published))
		}
		ev, _, err := events.Decode[events.CertIssued](fi.published[0])
		if err != nil {
			t.Fatalf("cert.issued does not decode: %v", err)
		}
		if ev.SPIFFEID != wantID || ev.Serial != pki.SerialHex(leaf) {
			t.Fatalf("cert.issued names %s serial %s, want %s serial %s", ev.SPIFFEID, ev.Serial, wantID, pki.SerialHex(leaf))
		}
		if cred%credCount == credToken && ev.Pod != (events.PodRef{Namespace: "shop", Name: tokenPod}) {
			t.Fatalf("cert.issued pod %q, want the token's %q", ev.Pod, tokenPod)
		}
	})
}
