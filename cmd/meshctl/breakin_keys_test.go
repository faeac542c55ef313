package main

// Break-in: a foreign client certificate on the gRPC CA API, and the search for
// private key bytes over everything the run left on the bus and on disk.

import (
	"bytes"
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"io/fs"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	securityv1 "istio.io/api/security/v1alpha1"
)

// newCA makes an attacker's self-signed CA for trustDomain.
func newCA(t *testing.T, trustDomain string) (crypto.Signer, *x509.Certificate) {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{Organization: []string{trustDomain}, CommonName: "meshagent root CA"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return key, c
}

// newLeaf makes a SPIFFE workload certificate for id under ca.
func newLeaf(t *testing.T, caKey crypto.Signer, ca *x509.Certificate, id string, ttl time.Duration) *x509.Certificate {
	t.Helper()
	c, _ := newLeafKey(t, caKey, ca, id, ttl)
	return c
}

func newLeafKey(t *testing.T, caKey crypto.Signer, ca *x509.Certificate, id string, ttl time.Duration) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(id)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), URIs: []*url.URL{u},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(ttl),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, key
}

func newCSR(t *testing.T, id string) string {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, id)
	if err != nil {
		t.Fatal(err)
	}
	return string(csr)
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

// foreignClientCert: on the Istio gRPC API, a client certificate from a foreign
// trust domain's CA, or from a foreign CA claiming this trust domain, gets nothing;
// the pod's own certificate (the control) renews.
func (h *breakin) foreignClientCert(t *testing.T) {
	const issued = `meshagent_signer_certs_issued_total{transport="grpc"}`
	before, stored := metric(t, h.st.Signer.HTTP, issued), h.stored(t, events.SubjectCertIssued)
	call := func(cert tls.Certificate) error {
		bundle, err := os.ReadFile(h.st.TrustBundle)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(bundle)
		creds := credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: h.st.Signer.GRPCServerName, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
		cc, err := grpc.NewClient(h.st.Signer.GRPCAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		_, err = securityv1.NewIstioCertificateServiceClient(cc).CreateCertificate(ctxT(t, 10*time.Second),
			&securityv1.IstioCertificateRequest{Csr: newCSR(t, "spiffe://cluster.local/ns/default/sa/demo"), ValidityDuration: 3600})
		return err
	}
	for _, c := range []struct{ name, td, id string }{
		{"foreign trust domain", "evil.example", "spiffe://evil.example/ns/default/sa/demo"},
		{"foreign CA claiming this trust domain", h.st.TrustDomain, "spiffe://cluster.local/ns/default/sa/demo"},
	} {
		t.Run(c.name, func(t *testing.T) {
			caKey, ca := newCA(t, c.td)
			leaf, key := newLeafKey(t, caKey, ca, c.id, time.Hour)
			err := call(tls.Certificate{Certificate: [][]byte{leaf.Raw, ca.Raw}, PrivateKey: key, Leaf: leaf})
			if status.Code(err) != codes.Unauthenticated {
				t.Fatalf("want Unauthenticated, got %v", err)
			}
		})
	}
	if got := metric(t, h.st.Signer.HTTP, issued); got != before {
		t.Fatalf("%v certificates issued over grpc to foreign certificates", got-before)
	}
	if got := h.stored(t, events.SubjectCertIssued); got != stored {
		t.Fatalf("%d cert.issued stored", got-stored)
	}
	// The control: the pod's own certificate from OUTPUT_CERTS renews.
	dir := h.podInfo(victim).OutputCerts
	own, err := tls.LoadX509KeyPair(filepath.Join(dir, "cert-chain.pem"), filepath.Join(dir, "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := call(own); err != nil {
		t.Fatalf("the pod's own certificate: %v", err)
	}
}

// keyRing holds every pod private key seen during the run, in every form one could
// leak in: PEM, DER, base64 and hex of the DER, and the raw scalar.
type keyRing struct {
	mu    sync.Mutex
	seen  map[string]bool   // DER of the keys added
	forms map[string][]byte // form name -> bytes
	n     int
}

func (k *keyRing) add(t *testing.T, keyPEM []byte) {
	t.Helper()
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		t.Fatalf("pod key: %v", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.forms == nil {
		k.forms, k.seen = map[string][]byte{}, map[string]bool{}
	}
	blk, _ := pem.Decode(keyPEM)
	if k.seen[string(blk.Bytes)] {
		return
	}
	k.seen[string(blk.Bytes)] = true
	k.n++
	add := func(form string, b []byte) { k.forms[form+" of pod key #"+strconv.Itoa(k.n)] = b }
	add("pem", bytes.TrimSpace(keyPEM))
	add("der", blk.Bytes)
	add("base64 der", []byte(base64.StdEncoding.EncodeToString(blk.Bytes)))
	add("raw base64 der", []byte(base64.RawURLEncoding.EncodeToString(blk.Bytes)))
	add("hex der", []byte(hex.EncodeToString(blk.Bytes)))
	if ec, ok := key.(*ecdsa.PrivateKey); ok {
		d, err := ec.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		add("scalar", d)
		add("base64 scalar", []byte(base64.RawURLEncoding.EncodeToString(d))) // as in a JWK
		add("hex scalar", []byte(hex.EncodeToString(d)))
	}
}

// find returns the forms of any pod key in data.
func (k *keyRing) find(data []byte) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var found []string
	for form, b := range k.forms {
		if bytes.Contains(data, b) {
			found = append(found, form)
		}
	}
	return found
}

// DER openings of an EC private key: SEC 1 (P-256, P-384) and PKCS#8 (P-256).
var derKeyPrefixes = [][]byte{
	{0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20},
	{0x30, 0x81, 0xa4, 0x02, 0x01, 0x01, 0x04, 0x30},
	{0x30, 0x81, 0x87, 0x02, 0x01, 0x00, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01},
}

var base64Run = regexp.MustCompile(`[A-Za-z0-9+/_-]{40,}={0,2}`)

// decodedRuns returns data and the decoding of every long base64 run in it, so that
// a key inside JSON or a CloudEvent is seen too.
func decodedRuns(data []byte) [][]byte {
	out := [][]byte{data}
	for _, run := range base64Run.FindAll(data, -1) {
		s := strings.TrimRight(string(run), "=")
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			if b, err := enc.DecodeString(s[:len(s)-len(s)%4]); err == nil {
				out = append(out, b)
			}
		}
	}
	return out
}

// keyLeaks names what in data looks like a private key: a pod key in any form, a
// "PRIVATE KEY" PEM label, or a DER EC private key, in clear or base64.
func (h *breakin) keyLeaks(data []byte) []string {
	var leaks []string
	for _, b := range decodedRuns(data) {
		leaks = append(leaks, h.keys.find(b)...)
		if bytes.Contains(b, []byte("PRIVATE KEY")) {
			leaks = append(leaks, "a PRIVATE KEY block")
		}
		for _, p := range derKeyPrefixes {
			if bytes.Contains(b, p) {
				leaks = append(leaks, "a DER EC private key")
			}
		}
	}
	return leaks
}

// rootScalars looks in data (and its base64 runs) for the private scalar of any
// P-256 root the signer served: every 32-byte window is tried as a key.
func (h *breakin) rootScalars(t *testing.T, data []byte) []string {
	t.Helper()
	pubs := map[string]string{}
	for fp, r := range h.rootsSeen {
		if pub, ok := r.PublicKey.(*ecdsa.PublicKey); ok && pub.Curve == elliptic.P256() {
			if e, err := pub.ECDH(); err == nil {
				pubs[string(e.Bytes())] = fp
			}
		}
	}
	var found []string
	for _, b := range decodedRuns(data) {
		for i := 0; i+32 <= len(b); i++ {
			k, err := ecdh.P256().NewPrivateKey(b[i : i+32])
			if err != nil {
				continue
			}
			if fp, ok := pubs[string(k.PublicKey().Bytes())]; ok {
				found = append(found, "the private key of root "+fp[:16])
			}
		}
	}
	return found
}

// noPrivateKeyBytes: after issue, renewals and root rotations, no pod key and no
// CA key is in any event the operator heard, any message of the event stream, or
// any file of the JetStream store (every KV bucket and stream on disk).
func (h *breakin) noPrivateKeyBytes(t *testing.T) {
	for _, p := range h.st.Pods {
		h.serving(t, p.ID)
		keyPEM, err := os.ReadFile(filepath.Join(p.OutputCerts, "key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		h.keys.add(t, keyPEM)
	}
	h.bundle(t)
	if h.keys.n < 4 || len(h.rootsSeen) < 3 {
		t.Fatalf("the run saw %d pod keys and %d roots: not a full run", h.keys.n, len(h.rootsSeen))
	}
	// The pods' public leaves are what the scans must be able to see.
	var leaf []byte
	{
		chain, err := os.ReadFile(filepath.Join(h.podInfo(victim).OutputCerts, "cert-chain.pem"))
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(chain)
		leaf = []byte(base64.StdEncoding.EncodeToString(blk.Bytes)[:64])
	}

	// The search finds a pod key as it would leak: inside an event's JSON, base64.
	{
		keyPEM, err := os.ReadFile(filepath.Join(h.podInfo(victim).OutputCerts, "key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(keyPEM)
		if h.keyLeaks([]byte(`{"data":"`+base64.StdEncoding.EncodeToString(blk.Bytes)+`"}`)) == nil || h.keyLeaks(keyPEM) == nil {
			t.Fatal("the search does not find a pod key in an event")
		}
	}

	tapped := h.tap.all()
	for _, m := range tapped {
		if leaks := h.keyLeaks(m.Data); len(leaks) > 0 {
			t.Errorf("event on %s holds %v", m.Subject, leaks)
		}
	}

	var read int
	for _, name := range []string{events.StreamEvents, events.StreamPodEvents} {
		s, err := h.events.Stream(ctxT(t, 5*time.Second), name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctxT(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			m, err := s.GetMsg(ctxT(t, 5*time.Second), seq)
			if err != nil {
				if err == jetstream.ErrMsgNotFound {
					continue
				}
				t.Fatalf("read %s event %d as audit: %v", name, seq, err)
			}
			read++
			if leaks := h.keyLeaks(m.Data); len(leaks) > 0 {
				t.Errorf("stored %s event %d on %s holds %v", name, seq, m.Subject, leaks)
			}
		}
	}
	if read == 0 || len(tapped) == 0 {
		t.Fatalf("read %d stored events and tapped %d: nothing searched", read, len(tapped))
	}

	var files, caFiles int
	var sawLeaf bool
	store := filepath.Join(h.dir, "nats")
	err := filepath.WalkDir(store, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		sawLeaf = sawLeaf || bytes.Contains(data, leaf)
		if leaks := h.keyLeaks(data); len(leaks) > 0 {
			t.Errorf("%s holds %v", path, leaks)
		}
		if strings.Contains(path, "KV_meshagent-ca") && strings.HasSuffix(path, ".blk") {
			caFiles++
			if found := h.rootScalars(t, data); len(found) > 0 {
				t.Errorf("%s holds %v", path, found)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 || caFiles == 0 || !sawLeaf {
		t.Fatalf("the store under %s: %d files, %d of the CA bucket, pod leaf seen %v: the search would miss what it looks for", store, files, caFiles, sawLeaf)
	}
	t.Logf("searched %d tapped events, %d stored events, %d store files (%d of the CA bucket) for %d pod keys and %d roots' keys",
		len(tapped), read, files, caFiles, h.keys.n, len(h.rootsSeen))
}
