package cli

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/sdstest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// sdsServing starts a real go-control-plane SDS server on a unix socket serving
// the node "meshctl" these secrets, and returns its socket.
func sdsServing(t *testing.T, secrets ...sdsclient.Secret) string {
	t.Helper()
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	var rs []types.Resource
	for _, s := range secrets {
		rs = append(rs, sdstest.EnvoySecret(s))
	}
	snap, err := cachev3.NewSnapshot("v1", map[resource.Type][]types.Resource{resource.SecretType: rs})
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.SetSnapshot(context.Background(), "meshctl", snap); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := grpc.NewServer()
	secretv3.RegisterSecretDiscoveryServiceServer(srv, serverv3.NewServer(ctx, cache, nil))
	path := filepath.Join(testkit.ShortDir(t), "sds.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Stop(); cancel() })
	return path
}

// TestSDSListsEveryResourceThePodServes: `meshctl sds` without names prints
// every resource a pod serves a workload, ROOTCA_SPIFFE included, without the
// user naming it (before, only default and ROOTCA); named resources print only
// those.
func TestSDSListsEveryResourceThePodServes(t *testing.T) {
	ca := testkit.NewCA(t, "mesh-root", nil, time.Now(), time.Hour)
	leaf := ca.Issue(t, testkit.Spec{Name: "web", ID: "spiffe://cluster.local/ns/shop/sa/web"})
	root := []byte(ca.PEM())
	socket := sdsServing(t,
		sdsclient.Secret{Name: "default", CertChain: []byte(leaf.PEM() + ca.PEM()), PrivateKey: []byte(leaf.KeyPEM(t))},
		sdsclient.Secret{Name: "ROOTCA", TrustedCA: root},
		sdsclient.Secret{Name: "ROOTCA_SPIFFE", TrustedCA: root})
	out, err := run(t, "sds", "-socket", socket)
	if err != nil {
		t.Fatalf("meshctl sds: %v\n%s", err, out)
	}
	for _, want := range []string{"default    spiffe://cluster.local/ns/shop/sa/web", "ROOTCA     root CN=mesh-root", "ROOTCA_SPIFFE root CN=mesh-root"} {
		if !strings.Contains(out, want) {
			t.Errorf("meshctl sds lacks %q:\n%s", want, out)
		}
	}
	out, err = run(t, "sds", "-socket", socket, "ROOTCA")
	if err != nil || strings.Contains(out, "default") || strings.Contains(out, "ROOTCA_SPIFFE") {
		t.Errorf("meshctl sds ROOTCA printed more than ROOTCA: %v\n%s", err, out)
	}
}
