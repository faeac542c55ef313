package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/testkit"
)

// pilotAgentMemory runs Istio's pilot-agent (the binary at pa) as a sidecar agent of
// the stack `meshctl up` keeps in dir, the way the pod beside it runs: its CA is the
// stack's signer over Istio's gRPC API (CA_ADDR, TLS checked against the stack's
// roots), its xDS upstream the stack's demo control plane, DNS capture on, and its
// "Envoy" the stand-in from bin, which holds SDS default and ROOTCA and one ADS
// stream through the agent. Once the stand-in is ready and idle for idle (as the
// pod was), it returns pilot-agent's own memory in MB (the stand-in excluded).
func pilotAgentMemory(b *testing.B, dir, bin, pa string, idle time.Duration) map[string]float64 {
	b.Helper()
	var stack struct {
		TrustBundle string `json:"trust_bundle"`
		Signer      struct {
			GRPCAddr   string `json:"grpc_addr"`
			ServerName string `json:"grpc_server_name"`
		} `json:"signer"`
		ControlPlane struct {
			XDSAddr string `json:"xds_addr"`
		} `json:"control_plane"`
		Pods []struct {
			ID             string `json:"id"`
			NodeID         string `json:"node_id"`
			Namespace      string `json:"namespace"`
			ServiceAccount string `json:"service_account"`
			TokenFile      string `json:"token_file"`
		} `json:"pods"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "stack.json"))
	if err != nil {
		b.Fatal(err)
	}
	if err := json.Unmarshal(data, &stack); err != nil || len(stack.Pods) == 0 || stack.Signer.GRPCAddr == "" {
		b.Fatalf("stack.json: %v (no pod or no signer gRPC address)", err)
	}
	pod := stack.Pods[0]
	// pilot-agent's paths are relative to its working directory, as in a pod.
	work := b.TempDir()
	copyFile(b, pod.TokenFile, filepath.Join(work, "var/run/secrets/tokens/istio-token"))
	copyFile(b, stack.TrustBundle, filepath.Join(work, "var/run/secrets/istio/root-cert.pem"))
	admin, status, dns := freePort(b), freePort(b), freePort(b)
	bootstrap := filepath.Join(work, "bootstrap.json")
	writeJSON(b, bootstrap, standinBootstrap(work, admin, pod.NodeID, pod.ID, pod.Namespace, pod.ServiceAccount))
	proxyConfig, _ := json.Marshal(map[string]any{
		"binaryPath": filepath.Join(bin, "envoy-standin"), "customConfigFile": bootstrap,
		"discoveryAddress": stack.ControlPlane.XDSAddr, "controlPlaneAuthPolicy": "NONE",
		"proxyAdminPort": admin, "statusPort": status, "drainDuration": "1s", "terminationDrainDuration": "1s",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+idle)
	defer cancel()
	cmd := exec.CommandContext(ctx, pa, "proxy", "sidecar")
	cmd.Dir = work
	cmd.Env = append(os.Environ(),
		"PROXY_CONFIG="+string(proxyConfig),
		"CA_ADDR="+stack.Signer.GRPCAddr, "ISTIOD_SAN="+stack.Signer.ServerName,
		"POD_NAME="+pod.ID, "POD_NAMESPACE="+pod.Namespace, "SERVICE_ACCOUNT="+pod.ServiceAccount,
		"INSTANCE_IP=127.0.0.1", "TRUST_DOMAIN=cluster.local",
		"ISTIO_META_DNS_CAPTURE=true", "DNS_PROXY_ADDR=127.0.0.1:"+strconv.Itoa(dns),
		// meshagent's debug tap off its fixed 15004: tests share the host's loopback.
		"PROXY_XDS_DEBUG_VIA_AGENT_PORT="+strconv.Itoa(freePort(b)),
		// The stand-in does not know this newer Envoy flag.
		"ENVOY_SKIP_DEPRECATED_LOGS=false")
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 20 * time.Second
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	var said tailLines // the last lines, for a failure message
	go said.read(out)
	ready := fmt.Sprintf("http://127.0.0.1:%d/ready", admin)
	if dl, _ := ctx.Deadline(); !testkit.Poll(time.Until(dl), func() bool { return standinLive(ready) }) {
		b.Fatalf("pilot-agent's stand-in never ready; pilot-agent said:\n%s", said.String())
	}
	if !testkit.Idle(ctx, idle) { // as the pod idled
		b.Fatalf("pilot-agent's run ended before its %s idle", idle)
	}
	got := map[string]float64{}
	for k, v := range smapsRollup(b, cmd.Process.Pid) {
		got[k] = v / 1024
	}
	return got
}

// standinBootstrap is the stand-in's bootstrap under pilot-agent: SDS and ADS over
// pilot-agent's sockets in work, admin on port, the pod's node (the demo control
// plane serves only the nodes it knows).
func standinBootstrap(work string, port int, node, pod, ns, sa string) map[string]any {
	pipe := func(name, path string) map[string]any {
		return map[string]any{"name": name, "type": "STATIC", "connect_timeout": "1s",
			"load_assignment": map[string]any{"cluster_name": name, "endpoints": []any{map[string]any{"lb_endpoints": []any{
				map[string]any{"endpoint": map[string]any{"address": map[string]any{"pipe": map[string]any{"path": path}}}}}}}},
			"typed_extension_protocol_options": map[string]any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": map[string]any{
				"@type":                "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
				"explicit_http_config": map[string]any{"http2_protocol_options": map[string]any{}}}}}
	}
	ads := map[string]any{"ads": map[string]any{}, "resource_api_version": "V3"}
	return map[string]any{
		"node": map[string]any{"id": node, "cluster": "istio-proxy",
			"metadata": map[string]any{"NAME": pod, "POD_NAME": pod, "NAMESPACE": ns, "SERVICE_ACCOUNT": sa}},
		"admin": map[string]any{"address": map[string]any{"socket_address": map[string]any{"address": "127.0.0.1", "port_value": port}}},
		"static_resources": map[string]any{"clusters": []any{
			pipe("sds-grpc", filepath.Join(work, "var/run/secrets/workload-spiffe-uds/socket")),
			pipe("xds-grpc", filepath.Join(work, "etc/istio/proxy/XDS")),
		}},
		"dynamic_resources": map[string]any{"lds_config": ads, "cds_config": ads, "ads_config": map[string]any{
			"api_type": "GRPC", "transport_api_version": "V3",
			"grpc_services": []any{map[string]any{"envoy_grpc": map[string]any{"cluster_name": "xds-grpc"}}}}},
	}
}

func standinLive(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK && string(body) == "LIVE\n"
}

// tailLines keeps the last 20 lines read.
type tailLines struct {
	mu    sync.Mutex
	lines []string
}

func (t *tailLines) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		t.mu.Lock()
		if t.lines = append(t.lines, sc.Text()); len(t.lines) > 20 {
			t.lines = t.lines[1:]
		}
		t.mu.Unlock()
	}
}

func (t *tailLines) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}

// freePort is testkit.FreeAddr's port (below the ephemeral range).
func freePort(b testing.TB) int {
	b.Helper()
	_, p, _ := net.SplitHostPort(testkit.FreeAddr(b))
	port, err := strconv.Atoi(p)
	if err != nil {
		b.Fatal(err)
	}
	return port
}

func copyFile(b testing.TB, from, to string) {
	b.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		b.Fatal(err)
	}
}

func writeJSON(b testing.TB, path string, v any) {
	b.Helper()
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
}
