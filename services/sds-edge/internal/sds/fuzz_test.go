package sds

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/hashicorp/go-hclog"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// fuzzFileRoot is the one file resource the fuzz resolver can load.
const fuzzFileRoot = secrets.FileRootPrefix + "/fuzz/roots.pem"

const fuzzPEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

// fuzzResolver loads fuzzFileRoot into the store and knows no other file.
type fuzzResolver struct{ store *secrets.Store }

func (r fuzzResolver) Resolve(name string) error {
	if name != fuzzFileRoot {
		return errors.New("no such file")
	}
	r.store.Set(sdsclient.Secret{Name: name, TrustedCA: []byte(fuzzPEM)})
	return nil
}

// fuzzObserver counts open streams, so that a test can see one left behind.
type fuzzObserver struct{ open atomic.Int64 }

func (*fuzzObserver) Served(string, *secrets.Entry)                   {}
func (*fuzzObserver) Nacked(string, []string, string, string, string) {}
func (*fuzzObserver) Asked(string, []string)                          {}
func (h *fuzzObserver) Stream(_ string, delta int)                    { h.open.Add(int64(delta)) }

// fuzzServer runs the SDS server on a unix socket in a temp dir, with default, ROOTCA
// and fuzzFileRoot servable, and returns a client connection to it.
func fuzzServer(f *testing.F) (secretv3.SecretDiscoveryServiceClient, *fuzzObserver) {
	f.Helper()
	store := secrets.New(nil)
	store.SetResolver(fuzzResolver{store})
	for _, s := range []sdsclient.Secret{
		{Name: secrets.Default, CertChain: []byte(fuzzPEM), PrivateKey: []byte("-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n")},
		{Name: secrets.RootCA, TrustedCA: []byte(fuzzPEM)},
	} {
		store.Set(s)
	}
	hooks := &fuzzObserver{}
	path := filepath.Join(f.TempDir(), "sds.sock")
	l := NewListener(path, 0o600, New(store, hooks, clock.Real{}, hclog.NewNullLogger()), hclog.NewNullLogger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	select {
	case <-l.Bound():
	case err := <-done:
		f.Fatalf("listener: %v", err)
	}
	cc, err := sdsclient.DialUnix(ctx, path)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		cc.Close()
		cancel()
		if err := <-done; err != nil {
			f.Errorf("listener: %v", err)
		}
	})
	return secretv3.NewSecretDiscoveryServiceClient(cc), hooks
}

// fuzzKnown reports whether the fuzz server can serve name.
func fuzzKnown(name string) bool {
	return name == secrets.Default || name == secrets.RootCA || name == fuzzFileRoot
}

// checkResources checks that resp carries exactly the secrets of names, in order.
func checkResources(t *testing.T, resp *discoveryv3.DiscoveryResponse, names []string) {
	t.Helper()
	if resp.GetTypeUrl() != sdsclient.SecretTypeURL || resp.GetNonce() == "" {
		t.Fatalf("response type %q nonce %q", resp.GetTypeUrl(), resp.GetNonce())
	}
	if len(resp.GetResources()) != len(names) {
		t.Fatalf("response has %d resources for names %q", len(resp.GetResources()), names)
	}
	for i, a := range resp.GetResources() {
		var s tlsv3.Secret
		if err := a.UnmarshalTo(&s); err != nil || s.GetName() != names[i] || s.ValidateAll() != nil {
			t.Fatalf("resource %d is %q (%v, %v), want %q", i, s.GetName(), err, s.ValidateAll(), names[i])
		}
	}
}

// FuzzSDSRequest sends DiscoveryRequests built from fuzzed fields (node id, type
// URL, version, nonce, resource names, error detail) to the real server over a
// unix socket, once as FetchSecrets and once as the first request of a
// StreamSecrets stream, then checks that a valid fetch still works.
//
// Properties: no panic; a request without a node id or with another type URL is
// InvalidArgument; a request naming an unknown resource gets NotFound and no
// secret; otherwise exactly the named secrets are returned (a stream's first
// request with a nonce answers nothing: it is stale); no stream is left open; and
// the server keeps serving valid requests.
func FuzzSDSRequest(f *testing.F) {
	client, hooks := fuzzServer(f)
	const node = "sidecar~10.0.0.1~web-0.shop~shop.svc.cluster.local"
	for _, s := range []struct {
		node, typeURL, version, nonce, names, errMsg string
		errCode                                      int32
	}{
		{node, sdsclient.SecretTypeURL, "", "", "default", "", 0},
		{node, "", "", "", "ROOTCA", "", 0},
		{node, sdsclient.SecretTypeURL, "", "", "default\nROOTCA", "", 0},
		{node, sdsclient.SecretTypeURL, "", "", "ROOTCA\nROOTCA\ndefault", "", 0},
		{node, sdsclient.SecretTypeURL, "", "", fuzzFileRoot, "", 0},
		{node, sdsclient.SecretTypeURL, "", "", "file-root:/etc/shadow", "", 0},
		{node, sdsclient.SecretTypeURL, "", "", "file-cert:/etc/ssl/a.pem~/etc/ssl/a.key", "", 0},
		{node, sdsclient.SecretTypeURL, "", "", "default\nspiffe://cluster.local/ns/kube-system/sa/admin", "", 0},
		{node, sdsclient.SecretTypeURL, "", "", "Default", "", 0},
		{node, sdsclient.SecretTypeURL, "", "", "", "", 0},
		{node, sdsclient.SecretTypeURL, "", "", "\n", "", 0},
		{"", sdsclient.SecretTypeURL, "", "", "default", "", 0},
		{node, "type.googleapis.com/envoy.config.cluster.v3.Cluster", "", "", "default", "", 0},
		{node, sdsclient.SecretTypeURL, "1", "1", "default", "", 0},
		{node, sdsclient.SecretTypeURL, "1", "1", "default", "bad key", 3},
		{node, sdsclient.SecretTypeURL, "", "", "default", "bad key", 3},
		{node, sdsclient.SecretTypeURL, "\xff", "\x00", "default\xff", "\xfe", -1},
		{strings.Repeat("n", 4096), sdsclient.SecretTypeURL, "", "", strings.Repeat("default\n", 200), "", 0},
	} {
		f.Add(s.node, s.typeURL, s.version, s.nonce, s.names, s.errMsg, s.errCode)
	}

	f.Fuzz(func(t *testing.T, node, typeURL, version, nonce, names, errMsg string, errCode int32) {
		// Proto strings must be UTF-8: the client would refuse to send anything else.
		valid := func(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
		node, typeURL, version, nonce, errMsg = valid(node), valid(typeURL), valid(version), valid(nonce), valid(errMsg)
		var resNames []string
		if names != "" {
			resNames = strings.Split(valid(names), "\n")
		}
		req := &discoveryv3.DiscoveryRequest{VersionInfo: version, ResponseNonce: nonce, TypeUrl: typeURL, ResourceNames: resNames}
		if node != "" {
			req.Node = &corev3.Node{Id: node}
		}
		if errMsg != "" || errCode != 0 {
			req.ErrorDetail = &statuspb.Status{Code: errCode, Message: errMsg}
		}
		// What the server must answer, in the order it checks.
		want := codes.OK
		switch {
		case node == "" || typeURL != "" && typeURL != sdsclient.SecretTypeURL:
			want = codes.InvalidArgument
		case !slices.ContainsFunc(resNames, func(n string) bool { return !fuzzKnown(n) }):
		default:
			want = codes.NotFound
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()

		// FetchSecrets.
		fetchWant := want
		if fetchWant == codes.OK && len(resNames) == 0 {
			fetchWant = codes.InvalidArgument
		}
		resp, err := client.FetchSecrets(ctx, req)
		if got := status.Code(err); got != fetchWant {
			t.Fatalf("FetchSecrets: %v, want code %s", err, fetchWant)
		}
		if err == nil {
			checkResources(t, resp, resNames)
		} else if resp != nil {
			t.Fatalf("FetchSecrets failed (%v) and returned %v", err, resp)
		}

		// StreamSecrets: the request, then the end of the client's side.
		stream, err := client.StreamSecrets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		// The stream looks at the nonce before the names: a first request with a
		// nonce is stale (nothing was sent yet), and is ignored whatever it names.
		streamWant := want
		if want == codes.NotFound && nonce != "" {
			streamWant = codes.OK
		}
		var got []*discoveryv3.DiscoveryResponse
		for {
			resp, err := stream.Recv()
			if err == io.EOF {
				err = nil
			}
			if err != nil || resp == nil {
				if status.Code(err) != streamWant {
					t.Fatalf("StreamSecrets ended with %v, want code %s", err, streamWant)
				}
				break
			}
			got = append(got, resp)
		}
		switch {
		case want != codes.OK || nonce != "" || len(resNames) == 0:
			// Refused, stale (nothing was sent yet, so any nonce is old) or asking for nothing.
			if len(got) != 0 {
				t.Fatalf("StreamSecrets sent %d responses, want none", len(got))
			}
		case len(got) != 1:
			t.Fatalf("StreamSecrets sent %d responses, want 1", len(got))
		default:
			checkResources(t, got[0], resNames)
		}
		if n := hooks.open.Load(); n != 0 {
			t.Fatalf("%d streams still open after the client saw them end", n)
		}

		// And a valid request still works.
		ok, err := client.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "sidecar~ok"}, ResourceNames: []string{secrets.Default}})
		if err != nil {
			t.Fatalf("valid fetch after the fuzzed request: %v", err)
		}
		checkResources(t, ok, []string{secrets.Default})
	})
}
