package bootstrap_test

import (
	"context"
	"encoding/json"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/services/launcher/internal/bootstrap"
	"github.com/meshagent/meshagent/services/launcher/internal/config"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestNodeAgreesWithPilotAgent runs Istio's real pilot-agent (PILOT_AGENT_BIN,
// built as docs/benchmarks.md says) and the launcher's config and bootstrap on
// the same pod (environment and pod root) and compares what Envoy gets: the
// node's cluster, its LABELS, its PROXY_CONFIG, and --concurrency. pilot-agent's Envoy is a script
// that keeps its arguments and bootstrap; its bootstrap template
// (testdata/pilot-agent-node.tmpl.json, ISTIO_BOOTSTRAP) renders only the node.
// Skipped without PILOT_AGENT_BIN.
func TestNodeAgreesWithPilotAgent(t *testing.T) {
	pa := os.Getenv("PILOT_AGENT_BIN")
	if pa == "" {
		t.Skip("PILOT_AGENT_BIN not set: no real pilot-agent to compare with")
	}
	tmpl, err := filepath.Abs("testdata/pilot-agent-node.tmpl.json")
	if err != nil {
		t.Fatal(err)
	}
	labels := "app=\"web\"\npod-template-hash=\"7d4f9\"\nversion=\"v1\"\n"
	for _, tc := range []struct {
		name       string
		env        map[string]string
		labelsFile string
		pcExtra    string
	}{
		{"labels file over the JSON labels, cpu limit", map[string]string{"ISTIO_METAJSON_LABELS": `{"app":"static","team":"a"}`, "ISTIO_CPU_LIMIT": "4"}, labels, ""},
		{"concurrency in PROXY_CONFIG wins over the cpu limit", map[string]string{"ISTIO_CPU_LIMIT": "4"}, labels, `,"concurrency":3`},
		{"no labels: the workload name", map[string]string{"ISTIO_META_WORKLOAD_NAME": "wl", "ISTIO_CPU_LIMIT": "2"}, "", ""},
		{"nothing: istio-proxy", map[string]string{"ISTIO_CPU_LIMIT": "1"}, "", ""},
		{"a readinessProbe and ISTIO_META_ISTIO_VERSION", map[string]string{"ISTIO_META_ISTIO_VERSION": "1.30.2", "ISTIO_CPU_LIMIT": "2"}, "",
			`,"readinessProbe":{"httpGet":{"path":"/ready","port":8080},"periodSeconds":1,"failureThreshold":2}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := testkit.ShortDir(t)
			if tc.labelsFile != "" {
				write(t, filepath.Join(root, config.PodLabelsFile), tc.labelsFile)
			}
			env := map[string]string{"POD_NAME": "web-7d4f9", "POD_NAMESPACE": "shop", "SERVICE_ACCOUNT": "web", "INSTANCE_IP": "127.0.0.1",
				"PROXY_CONFIG": `{"discoveryAddress":"127.0.0.1:15010","controlPlaneAuthPolicy":"NONE"` + tc.pcExtra + `}`}
			maps.Copy(env, tc.env)
			want := runPilotAgent(t, pa, root, tmpl, env)

			c, err := config.Load([]string{"-pod-root", root}, flagenv.Map(env))
			if err != nil {
				t.Fatal(err)
			}
			n := bootstrap.Node{Type: c.Pod.Type, IPs: c.Pod.IPs, Pod: c.Pod.ID, Namespace: c.Pod.Namespace, Labels: c.Pod.Labels, Meta: c.Pod.Meta,
				ProxyConfig: c.Pod.ProxyConfig}
			// PROXY_CONFIG metadata: every field the pod gave, as pilot-agent has it
			// (pilot-agent's also holds the defaults of the rest).
			ours, _ := n.Metadata()["PROXY_CONFIG"].(map[string]any)
			if len(ours) == 0 || want.proxyConfig == nil {
				t.Errorf("PROXY_CONFIG metadata %v, pilot-agent's %v", ours, want.proxyConfig)
			}
			for k, v := range ours {
				theirs, given := want.proxyConfig[k]
				if !given && v == protoDefaults[k] {
					continue // pilot-agent's protojson leaves a proto3 default out
				}
				if !reflect.DeepEqual(v, theirs) {
					t.Errorf("PROXY_CONFIG metadata %s: %v, pilot-agent's %v", k, v, want.proxyConfig[k])
				}
			}
			if got := n.ServiceCluster(); got != want.cluster {
				t.Errorf("cluster %q, pilot-agent's %q", got, want.cluster)
			}
			if !maps.Equal(c.Pod.Labels, want.labels) && (len(c.Pod.Labels) != 0 || len(want.labels) != 0) {
				t.Errorf("LABELS %v, pilot-agent's %v", c.Pod.Labels, want.labels)
			}
			if c.Envoy.Concurrency != want.concurrency {
				t.Errorf("--concurrency %d, pilot-agent's %d", c.Envoy.Concurrency, want.concurrency)
			}
			// ISTIO_VERSION: the override as given; else pilot-agent's own version
			// and the launcher's default name the same Istio minor release (the one
			// istiod's version gates compare first), as istiod parses them.
			version, _ := n.Metadata()["ISTIO_VERSION"].(string)
			if v := env["ISTIO_META_ISTIO_VERSION"]; v != "" {
				if version != v || want.istioVersion != v {
					t.Errorf("ISTIO_VERSION %q, pilot-agent's %q, want %q", version, want.istioVersion, v)
				}
			} else if minor(version) == "" || minor(version) != minor(want.istioVersion) {
				t.Errorf("ISTIO_VERSION %q, pilot-agent's %q: not the same Istio release", version, want.istioVersion)
			}
		})
	}
}

// protoDefaults are ProxyConfig values the tests give that are proto3 defaults,
// which pilot-agent's metadata (protojson) leaves out: NONE is
// AuthenticationPolicy's 0.
var protoDefaults = map[string]any{"controlPlaneAuthPolicy": "NONE"}

// agentSaw is what pilot-agent gave its Envoy.
type agentSaw struct {
	proxyConfig map[string]any
	cluster     string
	labels      map[string]string
	concurrency int
	// istioVersion is its node metadata ISTIO_VERSION.
	istioVersion string
}

// runPilotAgent runs pilot-agent proxy sidecar in root with env until its Envoy
// (a script) has started, and returns what that Envoy was given.
func runPilotAgent(t *testing.T, pa, root, tmpl string, env map[string]string) agentSaw {
	t.Helper()
	envoy := filepath.Join(root, "envoy")
	write(t, envoy, "#!/bin/sh\necho \"$@\" > \""+root+"/args.txt\"\ncp \"$2\" \""+root+"/bootstrap.json\"\nexec sleep 60\n")
	if err := os.Chmod(envoy, 0o755); err != nil {
		t.Fatal(err)
	}
	var pc map[string]any
	if err := json.Unmarshal([]byte(env["PROXY_CONFIG"]), &pc); err != nil {
		t.Fatal(err)
	}
	pc["binaryPath"], pc["proxyAdminPort"], pc["statusPort"] = envoy, freePort(t), freePort(t)
	pcJSON, _ := json.Marshal(pc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, pa, "proxy", "sidecar")
	cmd.Dir = root
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + root, "PROXY_CONFIG=" + string(pcJSON), "ISTIO_BOOTSTRAP=" + tmpl, "CA_ADDR=127.0.0.1:15010"}
	for k, v := range env {
		if k != "PROXY_CONFIG" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	// Its own process group, so that its Envoy script goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() }()
	var args, boot []byte
	if !testkit.Poll(40*time.Second, func() bool {
		args, _ = os.ReadFile(filepath.Join(root, "args.txt"))
		boot, _ = os.ReadFile(filepath.Join(root, "bootstrap.json"))
		return len(args) > 0 && len(boot) > 0
	}) {
		t.Fatalf("pilot-agent never started its Envoy; it said:\n%s", out.String())
	}
	var b struct {
		Node struct {
			Cluster  string `json:"cluster"`
			Metadata struct {
				Labels       map[string]string `json:"LABELS"`
				ProxyConfig  map[string]any    `json:"PROXY_CONFIG"`
				IstioVersion string            `json:"ISTIO_VERSION"`
			} `json:"metadata"`
		} `json:"node"`
	}
	if err := json.Unmarshal(boot, &b); err != nil {
		t.Fatalf("pilot-agent's bootstrap: %v\n%s", err, boot)
	}
	saw := agentSaw{cluster: b.Node.Cluster, labels: b.Node.Metadata.Labels, proxyConfig: b.Node.Metadata.ProxyConfig,
		istioVersion: b.Node.Metadata.IstioVersion}
	if f := strings.Fields(string(args)); len(f) > 0 {
		for i, a := range f[:len(f)-1] {
			if a == "--concurrency" {
				saw.concurrency, _ = strconv.Atoi(f[i+1])
			}
		}
	}
	return saw
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	_, p, _ := net.SplitHostPort(testkit.FreeAddr(t))
	n, _ := strconv.Atoi(p)
	return n
}

// minor is "major.minor" of an Istio version as istiod reads one
// (model.ParseIstioVersion), "" when it reads none.
func minor(v string) string {
	return regexp.MustCompile(`^[1-9][0-9]*\.[0-9]+`).FindString(strings.TrimPrefix(v, "release-"))
}
