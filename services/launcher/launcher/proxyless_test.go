package launcher_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// appEnv makes this test binary a proxyless gRPC app: grpc-go reads
// GRPC_XDS_BOOTSTRAP once, at start, so the app is its own process, as it is in a pod.
const appEnv = "MESHAGENT_TEST_PROXYLESS_APP"

const target = "web.shop"

// proxylessApp serves gRPC health through an xDS-managed server on APP_ADDR, and
// calls itself through the xds:/// resolver on a fresh channel every 100ms,
// printing the serial of the certificate each side showed the other:
// "client-saw <serial> server-saw <serial>".
func proxylessApp() int {
	sc, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		fmt.Println("app:", err)
		return 1
	}
	var mu sync.Mutex
	serverSaw := ""
	srv, err := xds.NewGRPCServer(grpc.Creds(sc), grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if p, ok := peer.FromContext(ctx); ok {
			if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
				mu.Lock()
				serverSaw = ti.State.PeerCertificates[0].SerialNumber.String()
				mu.Unlock()
			}
		}
		return h(ctx, req)
	}))
	if err != nil {
		fmt.Println("app:", err)
		return 1
	}
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", os.Getenv("APP_ADDR"))
	if err != nil {
		fmt.Println("app:", err)
		return 1
	}
	go func() { _ = srv.Serve(lis) }()
	cc, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		fmt.Println("app:", err)
		return 1
	}
	pace := time.NewTicker(100 * time.Millisecond) // one call at a time, ten a second
	defer pace.Stop()
	for ; ; <-pace.C {
		conn, err := grpc.NewClient("xds:///"+target, grpc.WithTransportCredentials(cc))
		if err != nil {
			fmt.Println("app:", err)
			return 1
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var p peer.Peer
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p), grpc.WaitForReady(true))
		cancel()
		_ = conn.Close()
		if err != nil {
			fmt.Println("rpc-error", err)
		} else if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			mu.Lock()
			fmt.Printf("client-saw %s server-saw %s\n", ti.State.PeerCertificates[0].SerialNumber, serverSaw)
			mu.Unlock()
		} else {
			fmt.Println("rpc-without-tls")
		}
	}
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// meshTLS is the common TLS context Istio's control plane sends proxyless gRPC:
// both the identity and the roots from the bootstrap's "default" provider.
func meshTLS() *tlsv3.CommonTlsContext {
	return &tlsv3.CommonTlsContext{
		TlsCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: "default", CertificateName: "default"},
		ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			CaCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: "default", CertificateName: "ROOTCA"}}},
	}
}

// proxylessConfig is the xDS a control plane serves the app: a client listener and
// an mTLS cluster for target, its endpoint, and the server's inbound listener.
func proxylessConfig(t *testing.T, addr string) map[resource.Type][]types.Resource {
	host, portS, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portS)
	router := mustAny(t, &routerv3.Router{})
	clientHCM := mustAny(t, &hcmv3.HttpConnectionManager{
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{Name: "route-" + target,
			VirtualHosts: []*routev3.VirtualHost{{Name: target, Domains: []string{target}, Routes: []*routev3.Route{{
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: target}}}}}}}}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	serverHCM := mustAny(t, &hcmv3.HttpConnectionManager{
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{Name: "inbound",
			VirtualHosts: []*routev3.VirtualHost{{Name: "inbound", Domains: []string{"*"}, Routes: []*routev3.Route{{
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}},
				Action: &routev3.Route_NonForwardingAction{NonForwardingAction: &routev3.NonForwardingAction{}}}}}}}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	ads := &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3, ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}
	return map[resource.Type][]types.Resource{
		resource.ListenerType: {
			&listenerv3.Listener{Name: target, ApiListener: &listenerv3.ApiListener{ApiListener: clientHCM}},
			&listenerv3.Listener{Name: "xds.istio.io/grpc/lds/inbound/" + addr,
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)}}}},
				FilterChains: []*listenerv3.FilterChain{{
					Filters: []*listenerv3.Filter{{Name: "hcm", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: serverHCM}}},
					TransportSocket: &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{
						TypedConfig: mustAny(t, &tlsv3.DownstreamTlsContext{RequireClientCertificate: wrapperspb.Bool(true), CommonTlsContext: meshTLS()})}},
				}},
			},
		},
		resource.ClusterType: {&clusterv3.Cluster{Name: target, ConnectTimeout: durationpb.New(time.Second),
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads},
			TransportSocket: &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{
				TypedConfig: mustAny(t, &tlsv3.UpstreamTlsContext{CommonTlsContext: meshTLS()})}},
		}},
		resource.EndpointType: {&endpointv3.ClusterLoadAssignment{ClusterName: target, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LoadBalancingWeight: wrapperspb.UInt32(1), Locality: &corev3.Locality{Region: "local", Zone: "a"},
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)}}}}}}}},
		}}}},
	}
}

// writeCerts is sds-edge writing OUTPUT_CERTS: key.pem, cert-chain.pem, root-cert.pem.
func writeCerts(t *testing.T, dir string, root, chain, key []byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"root-cert.pem": root, "cert-chain.pem": chain, "key.pem": key} {
		tmp := filepath.Join(dir, name+".tmp")
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// Without Envoy the launcher writes a gRPC xDS bootstrap; a real grpc-go xDS client
// and server read it, get their config through the relay's socket and do mTLS with
// sds-edge's files, and pick up a rotated certificate without a restart.
func TestProxylessGRPCDoesMTLSAcrossARotation(t *testing.T) {
	p := newPod(t)
	p.relayReady.Store(true)
	p.giveSecrets()
	certs := filepath.Join(p.dir, "certs")
	ca := testkit.NewCA(t, "root", nil, time.Now(), time.Hour)
	root := pki.EncodeCertPEM(ca.Cert)
	chain, key := leafCert(t, ca, 2)
	writeCerts(t, certs, root, chain, key)
	appAddr := testkit.FreeAddr(t)
	p.setConfig(proxylessConfig(t, appAddr))
	bootPath := filepath.Join(p.dir, "grpc-bootstrap.json")
	s := p.start(p.args("-disable-envoy", "-grpc-xds-bootstrap", bootPath, "-grpc-cert-refresh", "100ms",
		"-namespace", "shop", "-output-certs", certs)...)
	testkit.Eventually(t, "gRPC bootstrap written", func() bool { _, err := os.Stat(bootPath); return err == nil })
	var boot map[string]any
	data, _ := os.ReadFile(bootPath)
	if err := json.Unmarshal(data, &boot); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"file_watcher"`) || !strings.Contains(string(data), "unix://"+p.xdsSocket) ||
		!strings.Contains(string(data), "sidecar~127.0.0.1~web-0.shop~shop.svc.cluster.local") {
		t.Fatalf("bootstrap:\n%s", data)
	}
	if code, body := testkit.HTTPGet("http://" + s.l.StatusAddr() + "/healthz/ready"); code != 200 {
		t.Fatalf("proxyless ready: %d %s", code, body)
	}

	exe, _ := os.Executable()
	app := exec.Command(exe)
	app.Env = append(os.Environ(), appEnv+"=1", "GRPC_XDS_BOOTSTRAP="+bootPath, "APP_ADDR="+appAddr)
	out, err := app.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	app.Stderr = os.Stderr
	if err := app.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = app.Process.Kill(); _ = app.Wait() })
	var mu sync.Mutex
	var lines []string
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
		}
	}()
	saw := func(want string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, l := range lines {
				if l == want {
					return true
				}
			}
			return false
		}
	}
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(lines[max(0, len(lines)-5):], "\n")
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the app said:\n%s", last())
		}
	})
	// 30s: an xDS client and server starting in a child process.
	testkit.EventuallyWithin(t, 30*time.Second, "an mTLS call with the first certificate", saw("client-saw 2 server-saw 2"))
	chain, key = leafCert(t, ca, 3) // sds-edge renewed: new key, new serial
	writeCerts(t, certs, root, chain, key)
	testkit.EventuallyWithin(t, 30*time.Second, "a call with the rotated certificate", saw("client-saw 3 server-saw 3"))
}
