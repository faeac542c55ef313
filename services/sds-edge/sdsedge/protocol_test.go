package sdsedge_test

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestStaleNonceIgnored drives StreamSecrets by hand: a NACK that answers a response
// already replaced is stale and ignored; only the NACK of the newest one counts.
func TestStaleNonceIgnored(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := secretv3.NewSecretDiscoveryServiceClient(p.dial(t)).StreamSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := func(nonce string, nack bool) {
		t.Helper()
		r := &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "raw"}, TypeUrl: sdsclient.SecretTypeURL, ResourceNames: []string{"default"}, ResponseNonce: nonce}
		if nack {
			r.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: "no"}
		}
		if err := st.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	req("", false)
	r1, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	renew(t, v.nc, "")
	r2, err := st.Recv() // pushed without waiting for an ACK of r1
	if err != nil {
		t.Fatal(err)
	}
	if r2.GetNonce() == r1.GetNonce() || r2.GetVersionInfo() == r1.GetVersionInfo() {
		t.Fatal("push reused nonce or version")
	}
	req(r1.GetNonce(), true) // stale
	req(r2.GetNonce(), true) // current
	testkit.Eventually(t, "current nack counted", func() bool { return p.metric(t, "meshagent_sds_edge_nacks_total") >= 1 })
	if got := p.metric(t, "meshagent_sds_edge_nacks_total"); got != 1 {
		t.Fatalf("nacks counted %v, want 1 (the stale one ignored)", got)
	}
}

func TestWrongTypeURLRejected(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	st, err := secretv3.NewSecretDiscoveryServiceClient(p.dial(t)).StreamSecrets(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "raw"}, TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", ResourceNames: []string{"default"}})
	if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("wrong type: %v, want InvalidArgument", err)
	}
	st2, _ := secretv3.NewSecretDiscoveryServiceClient(p.dial(t)).StreamSecrets(context.Background())
	_ = st2.Send(&discoveryv3.DiscoveryRequest{TypeUrl: sdsclient.SecretTypeURL, ResourceNames: []string{"default"}})
	if _, err := st2.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no node: %v, want InvalidArgument", err)
	}
}

func TestDeltaNackPublished(t *testing.T) {
	v := newEnv(t)
	nacks := bustest.Record(t, v.nc, events.PodEventWildcard(events.PodEventSDSNack))
	p := v.startPod(podOpt{})
	ds, err := sdsclient.OpenDelta(context.Background(), p.dial(t), "delta-node", "default")
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	resp, err := ds.RecvRaw()
	if err != nil {
		t.Fatal(err)
	}
	if err := ds.Nack(resp, "rejected"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "delta nack published", func() bool {
		return len(bustest.Find(nacks, func(e events.SDSNack) bool {
			return e.Node == "delta-node" && e.Resource == "default" && e.Nonce == resp.Nonce && e.Error == "rejected"
		})) == 1
	})
}

// A client on go-control-plane's generated types (as Envoy's own protos) gets, over
// each of the three methods, secrets that decode with them and pass Envoy's
// validation: sds-edge writes its messages without those types (pkg/xdswire).
func TestGeneratedClientReadsEveryMethod(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	client := secretv3.NewSecretDiscoveryServiceClient(p.dial(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	check := func(method string, resources []*anypb.Any) {
		t.Helper()
		got := map[string]bool{}
		for _, a := range resources {
			var s tlsv3.Secret
			if err := a.UnmarshalTo(&s); err != nil || s.ValidateAll() != nil {
				t.Fatalf("%s: %v, %v", method, err, s.ValidateAll())
			}
			switch s.GetName() {
			case "default":
				got["default"] = len(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes()) > 0 &&
					len(s.GetTlsCertificate().GetPrivateKey().GetInlineBytes()) > 0
			case "ROOTCA":
				got["ROOTCA"] = len(s.GetValidationContext().GetTrustedCa().GetInlineBytes()) > 0
			}
		}
		if !got["default"] || !got["ROOTCA"] {
			t.Fatalf("%s: got %v", method, got)
		}
	}
	node := &corev3.Node{Id: "generated", Cluster: "c", UserAgentName: "envoy"}
	names := []string{"default", "ROOTCA"}

	fetched, err := client.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: sdsclient.SecretTypeURL, ResourceNames: names})
	if err != nil {
		t.Fatal(err)
	}
	check("FetchSecrets", fetched.GetResources())

	st, err := client.StreamSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: sdsclient.SecretTypeURL, ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetVersionInfo() == "" || resp.GetNonce() == "" || resp.GetTypeUrl() != sdsclient.SecretTypeURL {
		t.Fatalf("StreamSecrets response %v", resp)
	}
	check("StreamSecrets", resp.GetResources())

	ds, err := client.DeltaSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ds.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: sdsclient.SecretTypeURL, ResourceNamesSubscribe: names}); err != nil {
		t.Fatal(err)
	}
	dresp, err := ds.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var rs []*anypb.Any
	for _, r := range dresp.GetResources() {
		if r.GetVersion() == "" || r.GetName() == "" {
			t.Fatalf("delta resource %v", r)
		}
		rs = append(rs, r.GetResource())
	}
	check("DeltaSecrets", rs)
}
