package signer

import (
	"crypto/x509"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// headerBundle calls CreateCertificate as an Istio agent does and returns the trust
// bundle of the reply's header (events.TrustBundleHeader).
func headerBundle(t *testing.T, e *env, s *replica, trust []string) events.BundleReply {
	t.Helper()
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	var header metadata.MD
	if _, err := istioCreateOpts(istioClient(t, s, trust, nil, time.Now), e.token(t, "shop", "web"), "", csr, 3600, grpc.Header(&header)); err != nil {
		t.Fatal(err)
	}
	var b events.BundleReply
	if v := header.Get(events.TrustBundleHeader); len(v) != 1 || json.Unmarshal([]byte(v[0]), &b) != nil {
		t.Fatalf("header %s: %q", events.TrustBundleHeader, v)
	}
	return b
}

// Istio's CreateCertificate reply carries the signer's whole trust bundle in a
// response header (issue 37 item 2: the chain's last PEM vouches for nothing, so a
// gRPC pod could not learn that a root was retired): the bundle the bus serves,
// same roots and generation, endorsed so that it verifies under the root a pod
// trusts — after a rotation to a new key, under the old root alone too — and under
// no stranger's root.
func TestCreateCertificateSendsTheEndorsedBundle(t *testing.T) {
	e := newEnv(t)
	s := e.start(t, e.config("signer-a"))
	check := func(what string, trusted ...*x509.Certificate) {
		t.Helper()
		bus := bundle(t, e.nc)
		got := headerBundle(t, e, s, bus.Roots)
		if got.Generation != bus.Generation || !slices.Equal(got.Roots, bus.Roots) || got.TrustDomain != "cluster.local" {
			t.Fatalf("%s: header bundle gen %d (%d roots), bus bundle gen %d (%d roots)", what, got.Generation, len(got.Roots), bus.Generation, len(bus.Roots))
		}
		b := trustbundle.FromBundleReply(got)
		b.Whole = true
		if _, err := trustbundle.CheckUnder("cluster.local", trusted, b); err != nil {
			t.Fatalf("%s: the header's bundle does not verify under the trusted root: %v", what, err)
		}
		stranger := testkit.NewCA(t, "meshagent root CA", nil, time.Now(), time.Hour)
		if _, err := trustbundle.CheckUnder("cluster.local", []*x509.Certificate{stranger.Cert}, b); err == nil {
			t.Fatalf("%s: the header's bundle verifies under a stranger's root", what)
		}
	}
	before := mustCerts(t, bundle(t, e.nc).Roots)
	check("before a rotation", before...)
	if rr := natsCall[events.RotateRequest, events.RotateReply](t, e.nc, events.SubjectRootRotate, events.RotateRequest{NewKey: true}); rr.Error != nil {
		t.Fatal(rr.Error)
	}
	if n := len(bundle(t, e.nc).Roots); n != 2 {
		t.Fatalf("after a new-key rotation the bundle holds %d roots, want 2", n)
	}
	check("phase 1, a pod trusting the old root alone", before...)
}
