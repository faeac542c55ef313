package signer

import (
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/federation"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// bundleServer serves a SPIFFE bundle of td with n fresh roots over HTTPS.
func bundleServer(t *testing.T, td string, n int) *httptest.Server {
	var roots []*x509.Certificate
	for i := range n {
		roots = append(roots, testkit.NewCA(t, fmt.Sprintf("%s root %d", td, i), nil, time.Now(), time.Hour).Cert)
	}
	h, err := federation.Handler(spiffeid.RequireTrustDomainFromString(td), func() ([]*x509.Certificate, uint64) { return roots, 1 }, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// federationStatus asks the signers for the trust bundle with the followed
// domains' state, and checks the CA's endorsement of that state.
func federationStatus(t *testing.T, e *env) events.FederationStatus {
	t.Helper()
	rep := natsCall[events.BundleRequest, events.BundleReply](t, e.nc, events.SubjectTrustBundle, events.BundleRequest{Federation: true})
	if rep.Error != nil {
		t.Fatal(rep.Error)
	}
	roots, err := pki.ParseCertPEMs(rep.Roots)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := events.FederationStatusEndorsedBytes(rep.TrustDomain, rep.Federation)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.FederationEndorsements) != 1 {
		t.Fatalf("federation status endorsements: %+v", rep.FederationEndorsements)
	}
	en := rep.FederationEndorsements[0]
	if err := pki.VerifyEndorsement(roots, msg, en.KeyID, en.Signature, nil); err != nil {
		t.Fatalf("federation status not endorsed by the CA: %v", err)
	}
	var st events.FederationStatus
	if err := json.Unmarshal(rep.Federation, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func domainOf(st events.FederationStatus, td string) (events.FederatedDomain, bool) {
	for _, d := range st.Domains {
		if d.TrustDomain == td {
			return d, true
		}
	}
	return events.FederatedDomain{}, false
}

// A signer follows three foreign domains: one good, one whose bundle is too
// large to announce (150 roots, over an event's bound), one whose endpoint
// redirects to an internal http URL. The good one is announced; the other two
// are never announced, the redirect target is never contacted, and all three
// are visible with their state — in the endorsed bundle reply meshctl trust
// reads, and in the signer's metrics — instead of in an ERROR log line only.
func TestBreakInFederationStateVisible(t *testing.T) {
	e := newEnv(t)
	south := bundleServer(t, "south.example", 1)
	west := bundleServer(t, "west.example", 150)
	var internalHits atomic.Int64
	internal := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { internalHits.Add(1) }))
	t.Cleanup(internal.Close)
	north := httptest.NewTLSServer(http.RedirectHandler(internal.URL+"/admin", http.StatusFound))
	t.Cleanup(north.Close)
	caFile := filepath.Join(t.TempDir(), "endpoints.pem")
	if err := os.WriteFile(caFile, pki.EncodeCertPEM(south.Certificate()), 0o600); err != nil { // httptest's one certificate
		t.Fatal(err)
	}
	cfg := e.config("s1")
	cfg.Federation.CAFile = caFile
	cfg.Federation.MinRefresh = 50 * time.Millisecond
	cfg.Federation.Endpoints = "south.example|" + south.URL + "||west.example|" + west.URL + "||north.example|" + north.URL
	r := e.start(t, cfg)

	var st events.FederationStatus
	testkit.Eventually(t, "all three domains show their state", func() bool {
		st = federationStatus(t, e)
		s, _ := domainOf(st, "south.example")
		w, _ := domainOf(st, "west.example")
		n, _ := domainOf(st, "north.example")
		return s.State == events.FederationOK && w.Errors[federation.ReasonAnnounce] >= 2 && n.Errors[federation.ReasonRedirect] >= 2
	})
	s, _ := domainOf(st, "south.example")
	w, _ := domainOf(st, "west.example")
	n, _ := domainOf(st, "north.example")
	if st.Signer != "s1" || s.Roots != 1 || len(s.RootInfo) != 1 || len(s.RootInfo[0].SHA256) != 64 || s.RootInfo[0].NotAfter.IsZero() ||
		s.LastSuccess.IsZero() || !s.NextRefresh.After(s.LastSuccess) || s.Error != "" {
		t.Errorf("south = %+v", s)
	}
	if w.State != events.FederationNever || w.Roots != 0 || w.ErrorReason != federation.ReasonAnnounce || !strings.Contains(w.Error, "too large") || w.LastErrorAt.IsZero() {
		t.Errorf("west = %+v", w)
	}
	if n.State != events.FederationNever || n.ErrorReason != federation.ReasonRedirect || !strings.Contains(n.Error, internal.URL) {
		t.Errorf("north = %+v", n)
	}

	// What the fleet was told: south only.
	subj := func(td string) string { s, _ := events.TrustFederatedSubject(td); return s }
	if c := count(t, e.js, subj("south.example")); c == 0 {
		t.Error("south's bundle was never announced")
	}
	for _, td := range []string{"west.example", "north.example"} {
		if c := count(t, e.js, subj(td)); c != 0 {
			t.Errorf("%s announced %d times", td, c)
		}
	}
	if h := internalHits.Load(); h != 0 {
		t.Errorf("the redirect target was contacted %d times", h)
	}

	r.wantMetrics(t,
		`meshagent_signer_federation_up{trust_domain="south.example"} 1`,
		`meshagent_signer_federation_up{trust_domain="west.example"} 0`,
		`meshagent_signer_federation_roots{trust_domain="south.example"} 1`,
		`meshagent_signer_federation_last_success_timestamp_seconds{trust_domain="south.example"}`,
		`meshagent_signer_federation_roots_earliest_expiry_timestamp_seconds{trust_domain="south.example"}`,
		`meshagent_signer_federation_last_error_timestamp_seconds{trust_domain="north.example"}`,
		`meshagent_signer_federation_next_refresh_timestamp_seconds{trust_domain="west.example"}`,
		`meshagent_signer_federation_refresh_errors_total{reason="announce",trust_domain="west.example"}`,
		`meshagent_signer_federation_refresh_errors_total{reason="redirect",trust_domain="north.example"}`,
	)
	if body := r.metrics(t); strings.Contains(body, `meshagent_signer_federation_last_success_timestamp_seconds{trust_domain="west.example"}`) {
		t.Error("a success is reported for a domain never announced")
	}
}

// Pods' bundle requests do not carry the federation state: only a request that
// asks for it gets it.
func TestBundleReplyCarriesFederationOnlyWhenAsked(t *testing.T) {
	e := newEnv(t)
	e.start(t, e.config("s1"))
	if rep := bundle(t, e.nc); len(rep.Federation) != 0 || len(rep.FederationEndorsements) != 0 {
		t.Fatalf("plain bundle reply carries federation state: %s", rep.Federation)
	}
	if st := federationStatus(t, e); st.Signer != "s1" || len(st.Domains) != 0 {
		t.Fatalf("status of a signer following nothing: %+v", st)
	}
}
