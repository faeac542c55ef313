package kubecsr

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const webID = "spiffe://cluster.local/ns/shop/sa/web"

func csrOf(t *testing.T, tmpl *x509.CertificateRequest) *x509.CertificateRequest {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

func uris(s ...string) []*url.URL {
	var out []*url.URL
	for _, v := range s {
		u, _ := url.Parse(v)
		out = append(out, u)
	}
	return out
}

// A CSR reaches the external signer only when it names the caller and nothing
// else, as meshagent's pods and Istio's agent write it.
func TestCheckCSRNamesOnlyTheCaller(t *testing.T) {
	id := uris(webID)[0]
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	ours, err := pki.NewCSR(key, webID)
	if err != nil {
		t.Fatal(err)
	}
	meshagent, err := pki.ParseCSR(ours)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		csr  *x509.CertificateRequest
		ok   bool
	}{
		{"meshagent's pod CSR", meshagent, true},
		{"Istio's agent CSR (O=\"\")", csrOf(t, &x509.CertificateRequest{Subject: pkix.Name{Organization: []string{""}}, URIs: uris(webID)}), true},
		{"another identity", csrOf(t, &x509.CertificateRequest{URIs: uris("spiffe://cluster.local/ns/kube-system/sa/admin")}), false},
		{"two identities", csrOf(t, &x509.CertificateRequest{URIs: uris(webID, "spiffe://cluster.local/ns/shop/sa/db")}), false},
		{"no identity", csrOf(t, &x509.CertificateRequest{DNSNames: []string{"web.shop.svc"}}), false},
		{"a DNS name too", csrOf(t, &x509.CertificateRequest{URIs: uris(webID), DNSNames: []string{"kubernetes.default.svc"}}), false},
		{"a subject", csrOf(t, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:admin", Organization: []string{"system:masters"}}, URIs: uris(webID)}), false},
		{"another extension", csrOf(t, &x509.CertificateRequest{URIs: uris(webID), ExtraExtensions: []pkix.Extension{{Id: []int{2, 5, 29, 19}, Critical: true, Value: []byte{0x30, 0x03, 0x01, 0x01, 0xff}}}}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckCSR(tc.csr, id)
			if (err == nil) != tc.ok {
				t.Fatalf("CheckCSR: %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// What the external signer wrote is taken only when it certifies the CSR's key
// for exactly the caller, is no CA, and verifies to the configured roots.
func TestCheckLeafTakesOnlyWhatWasAsked(t *testing.T) {
	id := uris(webID)[0]
	now := time.Now()
	root := testkit.NewCA(t, "external root", nil, now, 24*time.Hour)
	inter := testkit.NewCA(t, "external intermediate", root, now, 24*time.Hour)
	other := testkit.NewCA(t, "another root", nil, now, 24*time.Hour)
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	csrPEM, err := pki.NewCSR(key, webID)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.ParseCSR(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	leafOf := func(by *testkit.CA, s testkit.Spec) []byte {
		if s.Key == nil {
			s.Key = key
		}
		l := by.Issue(t, s)
		return []byte(l.PEM() + by.PEM())
	}
	good := leafOf(inter, testkit.Spec{ID: webID})
	leaf, above, err := CheckLeaf(good, csr, id, []*x509.Certificate{root.Cert}, now)
	if err != nil {
		t.Fatalf("a good leaf: %v", err)
	}
	if leaf.URIs[0].String() != webID || len(above) != 2 || !above[0].Equal(inter.Cert) || !above[1].Equal(root.Cert) {
		t.Fatalf("a good leaf: %s above %d", leaf.URIs, len(above))
	}
	otherKey, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		chain []byte
		says  string
	}{
		{"another key", leafOf(inter, testkit.Spec{ID: webID, Key: otherKey}), "not for the CSR's key"},
		{"another identity", leafOf(inter, testkit.Spec{ID: "spiffe://cluster.local/ns/kube-system/sa/admin"}), "not exactly"},
		{"a DNS name too", leafOf(inter, testkit.Spec{ID: webID, DNS: []string{"web.shop.svc"}}), "not exactly"},
		{"a CA", leafOf(inter, testkit.Spec{ID: webID, IsCA: true}), "is a CA"},
		{"another root", leafOf(other, testkit.Spec{ID: webID}), "does not verify"},
		{"not PEM", []byte("garbage"), "external signer's certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := CheckLeaf(tc.chain, csr, id, []*x509.Certificate{root.Cert}, now)
			if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("CheckLeaf: %v, want an error saying %q", err, tc.says)
			}
		})
	}
}

// fakeAPI answers the CSR API as the API server does, over real HTTP(S), for
// the client's protocol: create, approve, watch (each watch answering with the
// next of watches, then ending), delete.
type fakeAPI struct {
	mu      sync.Mutex
	watches [][]string // per watch request, the events it streams (JSON objects)
	deleted []string
	seen    []string // method and path of each request
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen = append(f.seen, r.Method+" "+r.URL.Path)
	const base = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
	obj := func(rv string, status string) string {
		return fmt.Sprintf(`{"metadata":{"name":"csr-workload-x","resourceVersion":%q},"status":%s}`, rv, status)
	}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == base:
		body, _ := io.ReadAll(r.Body)
		var got struct {
			Spec struct {
				Request    []byte   `json:"request"`
				SignerName string   `json:"signerName"`
				Usages     []string `json:"usages"`
				Expiration int64    `json:"expirationSeconds"`
			} `json:"spec"`
		}
		if json.Unmarshal(body, &got) != nil || got.Spec.SignerName != "example.com/s" || got.Spec.Expiration != 3600 || len(got.Spec.Request) == 0 {
			http.Error(w, "bad create "+string(body), http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, obj("1", "{}"))
	case r.Method == http.MethodPut && r.URL.Path == base+"/csr-workload-x/approval":
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"type":"Approved"`) {
			http.Error(w, "no approval", http.StatusUnprocessableEntity)
			return
		}
		_, _ = io.WriteString(w, obj("2", `{"conditions":[{"type":"Approved","status":"True"}]}`))
	case r.Method == http.MethodGet && r.URL.Path == base && r.URL.Query().Get("watch") == "1":
		if r.URL.Query().Get("fieldSelector") != "metadata.name=csr-workload-x" {
			http.Error(w, "unselected watch", http.StatusBadRequest)
			return
		}
		var evs []string
		if len(f.watches) > 0 {
			evs, f.watches = f.watches[0], f.watches[1:]
		}
		for _, e := range evs {
			_, _ = io.WriteString(w, e+"\n")
		}
	case r.Method == http.MethodDelete && r.URL.Path == base+"/csr-workload-x":
		f.deleted = append(f.deleted, "csr-workload-x")
		_, _ = io.WriteString(w, `{}`)
	default:
		http.Error(w, "unexpected "+r.Method+" "+r.URL.String(), http.StatusNotFound)
	}
}

func newFake(t *testing.T, f *fakeAPI, timeout time.Duration) *Client {
	t.Helper()
	srv := httptest.NewTLSServer(f)
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{URL: srv.URL, CAFile: caFile, SignerName: "example.com/s", Timeout: timeout}, hclog.NewNullLogger(), clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The client's protocol over real HTTP: a watch that ends without news is
// watched again from the last version; a certificate ends it; a Denied or
// Failed condition, a deletion or a watch error is a refusal naming why; no
// news within the timeout is ErrTimeout. The CSR object is deleted every time.
func TestSignWatchesUntilAVerdict(t *testing.T) {
	ev := func(typ, rv, status string) string {
		return fmt.Sprintf(`{"type":%q,"object":{"metadata":{"name":"csr-workload-x","resourceVersion":%q},"status":%s}}`, typ, rv, status)
	}
	certB64 := "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1BPT0KLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=" // any bytes: the RA checks them, not the client
	for _, tc := range []struct {
		name    string
		watches [][]string
		want    error  // nil: a certificate
		says    string // in the error
	}{
		{"signed after a watch ended", [][]string{{ev("MODIFIED", "3", `{}`)}, {ev("MODIFIED", "4", `{"certificate":"`+certB64+`"}`)}}, nil, ""},
		{"denied", [][]string{{ev("MODIFIED", "3", `{"conditions":[{"type":"Denied","status":"True","reason":"Policy","message":"no"}]}`)}}, ErrRefused, "denied: Policy: no"},
		{"failed", [][]string{{ev("MODIFIED", "3", `{"conditions":[{"type":"Failed","status":"True","reason":"SignerValidationFailure","message":"invalid usage for client certificate: server auth"}]}`)}}, ErrRefused, "invalid usage for client certificate"},
		{"deleted", [][]string{{ev("DELETED", "3", `{}`)}}, ErrRefused, "deleted before it was signed"},
		{"watch error", [][]string{{`{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old resource version"}}`}}, ErrAPI, "too old resource version"},
		{"nobody signs", nil, ErrTimeout, "no certificate within 300ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Only the case without a verdict waits out its timeout; the others
			// have a minute, which a loaded machine never runs out.
			timeout := time.Minute
			if tc.want == ErrTimeout {
				timeout = 300 * time.Millisecond
			}
			f := &fakeAPI{watches: tc.watches}
			c := newFake(t, f, timeout)
			chain, err := c.Sign(context.Background(), []byte("-----BEGIN CERTIFICATE REQUEST-----\nMA==\n-----END CERTIFICATE REQUEST-----\n"), time.Hour)
			if tc.want == nil {
				if err != nil || !strings.Contains(string(chain), "BEGIN CERTIFICATE") {
					t.Fatalf("Sign: %q, %v; want the certificate", chain, err)
				}
			} else if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Sign: %v; want %v saying %q", err, tc.want, tc.says)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.deleted) != 1 {
				t.Fatalf("deleted %v, want the CSR once (requests: %v)", f.deleted, f.seen)
			}
		})
	}
}

// An API server that does not answer is ErrAPI (the issuer's Unavailable: the
// caller retries), and nothing was created to delete.
func TestSignWithoutAnAPIServer(t *testing.T) {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	addr := srv.URL
	srv.Close()
	c, err := New(Config{URL: addr, SignerName: "example.com/s", Timeout: time.Second}, hclog.NewNullLogger(), clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sign(context.Background(), []byte("csr"), time.Hour); !errors.Is(err, ErrAPI) || !strings.Contains(err.Error(), "create csr") {
		t.Fatalf("Sign: %v; want ErrAPI creating the CSR", err)
	}
}
