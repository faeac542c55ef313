package signer

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	pb "istio.io/api/security/v1alpha1"
)

// podAPI is a stand-in for the Kubernetes API server's pod reads, over TLS: it wants
// the signer's bearer token and answers GET pod and list pods by spec.nodeName, as
// the API server does.
type podAPI struct {
	srv    *httptest.Server
	caFile string
	bearer string

	mu   sync.Mutex
	pods map[string]map[string]string // ns -> name -> "node/serviceaccount"
}

func newPodAPI(t *testing.T) *podAPI {
	t.Helper()
	a := &podAPI{pods: map[string]map[string]string{}}
	a.srv = httptest.NewTLSServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.srv.Close)
	dir := t.TempDir()
	a.caFile, a.bearer = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	if err := os.WriteFile(a.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(a.bearer, []byte("signer-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return a
}

func (a *podAPI) put(ns, name, node, sa string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pods[ns] == nil {
		a.pods[ns] = map[string]string{}
	}
	a.pods[ns][name] = node + "/" + sa
}

func (a *podAPI) object(name, v string) map[string]any {
	node, sa, _ := strings.Cut(v, "/")
	return map[string]any{"kind": "Pod", "apiVersion": "v1", "metadata": map[string]any{"name": name},
		"spec": map[string]any{"nodeName": node, "serviceAccountName": sa}, "status": map[string]any{"phase": "Running"}}
}

func (a *podAPI) serve(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer signer-token" {
		http.Error(w, `{"kind":"Status","code":401}`, http.StatusUnauthorized)
		return
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/api/v1/namespaces/"), "/")
	if r.Method != http.MethodGet || !strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/") || len(parts) < 2 || parts[1] != "pods" {
		http.NotFound(w, r)
		return
	}
	ns := a.pods[parts[0]]
	w.Header().Set("Content-Type", "application/json")
	if len(parts) == 3 { // one pod
		v, ok := ns[parts[2]]
		if !ok {
			http.Error(w, `{"kind":"Status","code":404,"reason":"NotFound"}`, http.StatusNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode(a.object(parts[2], v))
		return
	}
	sel := r.URL.Query().Get("fieldSelector")
	node, ok := strings.CutPrefix(sel, "spec.nodeName=")
	if sel != "" && !ok {
		http.Error(w, "unsupported field selector", http.StatusBadRequest)
		return
	}
	items := []any{}
	for name, v := range ns {
		if sel == "" || strings.HasPrefix(v, node+"/") {
			items = append(items, a.object(name, v))
		}
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"kind": "PodList", "apiVersion": "v1", "items": items})
}

// istioImpersonate calls CreateCertificate asking for another identity, with Istio's
// ImpersonatedIdentity request metadata.
func istioImpersonate(c pb.IstioCertificateServiceClient, token, target string, csr []byte) (*pb.IstioCertificateResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.NewOutgoingContext(ctx, metadata.Pairs("authorization", "Bearer "+token))
	req := &pb.IstioCertificateRequest{Csr: string(csr), ValidityDuration: 3600,
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"ImpersonatedIdentity": structpb.NewStringValue(target)}}}
	return c.CreateCertificate(ctx, req)
}

// A trusted node agent (CA_TRUSTED_NODE_ACCOUNTS) gets a certificate for a workload
// running on its own node, as the API server says; for one on another node, and for
// anyone else asking, the request is refused naming why, never issued for the
// caller's own identity instead.
func TestImpersonationByTrustedNodeAgent(t *testing.T) {
	api := newPodAPI(t)
	api.put("istio-system", "ztunnel-a", "node-a", "ztunnel")
	api.put("shop", "web-1", "node-a", "web")
	api.put("shop", "db-1", "node-b", "db")

	e := newEnv(t)
	cfg := e.config("signer-a")
	cfg.Nodes.TrustedAccounts = []string{"istio-system/ztunnel"}
	cfg.Nodes.APIURL, cfg.Nodes.CAFile, cfg.Nodes.BearerFile = api.srv.URL, api.caFile, api.bearer
	s := e.start(t, cfg)
	rep := bundle(t, e.nc)
	c := istioClient(t, s, rep.Roots, nil, time.Now)
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	now := e.clock.Now().Add(-time.Second)
	ztunnel := e.iss.Mint(t, e.iss.ServiceAccount("istio-system", "ztunnel", now, time.Hour).ForPod("ztunnel-a"))

	got, err := istioImpersonate(c, ztunnel, "spiffe://cluster.local/ns/shop/sa/web", csr)
	if err != nil {
		t.Fatalf("trusted node agent for a workload on its node: %v", err)
	}
	if leaf := verifyChain(t, got.CertChain, rep.Roots, time.Now()); leaf.URIs[0].String() != "spiffe://cluster.local/ns/shop/sa/web" {
		t.Fatalf("issued for %v", leaf.URIs)
	}

	refused := func(what, token, target, want string) {
		t.Helper()
		_, err := istioImpersonate(c, token, target, csr)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), want) {
			t.Fatalf("%s: got %v, want PermissionDenied naming %q", what, err, want)
		}
	}
	refused("workload on another node", ztunnel, "spiffe://cluster.local/ns/shop/sa/db", `on node "node-a"`)
	refused("other trust domain", ztunnel, "spiffe://other.example/ns/shop/sa/web", "trust domain")
	refused("untrusted caller", e.token(t, "shop", "web"), "spiffe://cluster.local/ns/shop/sa/db", "not a trusted node account")
	unbound := e.token(t, "istio-system", "ztunnel")
	refused("node agent without a pod-bound token", unbound, "spiffe://cluster.local/ns/shop/sa/web", "pod-bound token")
	api.put("istio-system", "ztunnel-a", "node-b", "ztunnel") // the agent's pod now on node-b
	refused("workload no longer on the agent's node", ztunnel, "spiffe://cluster.local/ns/shop/sa/web", `node "node-b"`)
}

// Without CA_TRUSTED_NODE_ACCOUNTS nobody may impersonate: the request is refused,
// not silently issued for the caller's own identity.
func TestImpersonationRefusedWhenNotConfigured(t *testing.T) {
	e := newEnv(t)
	s := e.start(t, e.config("signer-a"))
	rep := bundle(t, e.nc)
	c := istioClient(t, s, rep.Roots, nil, time.Now)
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	_, err := istioImpersonate(c, e.token(t, "shop", "web"), "spiffe://cluster.local/ns/shop/sa/db", csr)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "CA_TRUSTED_NODE_ACCOUNTS") {
		t.Fatalf("got %v, want PermissionDenied naming CA_TRUSTED_NODE_ACCOUNTS", err)
	}
}
