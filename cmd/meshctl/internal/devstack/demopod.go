package devstack

import (
	"cmp"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/kubeapi"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/kubelet"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/supervisor"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// maxSocketPath is the longest unix socket path Linux accepts (sun_path less its NUL).
const maxSocketPath = 107

// longestSocket is the deepest socket a pod root holds (sds-edge's).
const longestSocket = "var/run/secrets/workload-spiffe-uds/socket"

// podsDir returns dir/pods, or a fresh directory under the system temp dir when the
// sockets under dir/pods would be longer than a unix socket path may be — a checkout
// deep in a home directory must still run.
func podsDir(dir string, pods int) (string, error) {
	want := filepath.Join(dir, "pods")
	last := filepath.Join(want, fmt.Sprintf("demo-%d", max(pods-1, 0)), longestSocket)
	if len(last) <= maxSocketPath {
		return want, os.MkdirAll(want, 0o755)
	}
	short, err := os.MkdirTemp("", "meshagent-pods-")
	if err != nil {
		return "", fmt.Errorf("pods dir: %w", err)
	}
	if len(filepath.Join(short, "demo-00", longestSocket)) > maxSocketPath {
		return "", fmt.Errorf("pods dir: %s is too deep for unix sockets too; set TMPDIR or -dir to a shorter path", short)
	}
	return short, nil
}

// DemoNamespace and DemoServiceAccount are the demo pods' (demoPod).
const DemoNamespace, DemoServiceAccount = "default", "demo"

// demoPod is demo pod id as the bus knows it.
func demoPod(id string) events.PodRef { return events.PodRef{Namespace: DemoNamespace, Name: id} }

// startPod launches demo pod id's processes (not waiting for them) with its
// token written, and adds it to the stack; node is the node tier's node it runs
// on ("": none, it connects to the hub).
func (r *Runner) startPod(id, node string) (*podStart, error) {
	pod, err := r.podFiles(id)
	if err != nil {
		return nil, err
	}
	pod.Node = node
	r.nodeAPI.Add(kubeapi.Pod{Namespace: pod.Namespace, Name: id, ServiceAccount: pod.ServiceAccount, Node: cmp.Or(pod.Node, Node)})
	tok := kubelet.Token{File: pod.TokenFile, Namespace: pod.Namespace, ServiceAccount: pod.ServiceAccount, Pod: id, Node: pod.Node}
	r.kube.Tokens = append(r.kube.Tokens, tok)
	if err := r.kube.Write(tok, time.Now()); err != nil {
		return nil, err
	}
	roles, err := r.podRoleArgs(&pod)
	if err != nil {
		return nil, err
	}
	ps, err := r.launchPod(pod, roles)
	if err != nil {
		return nil, err
	}
	r.Stack.Pods = append(r.Stack.Pods, pod)
	return ps, nil
}

// podFiles is demo pod id as stack.json names it: its identity and the files
// under its root.
func (r *Runner) podFiles(id string) (stackfile.Pod, error) {
	const ns, sa = DemoNamespace, DemoServiceAccount
	root := filepath.Join(r.podsDir, id)
	pod := stackfile.Pod{
		ID: id, Namespace: ns, ServiceAccount: sa, Root: root,
		SDSSocket:   filepath.Join(root, "var/run/secrets/workload-spiffe-uds/socket"),
		XDSSocket:   filepath.Join(root, "etc/istio/proxy/XDS"),
		TokenFile:   filepath.Join(root, "var/run/secrets/tokens/istio-token"),
		OutputCerts: filepath.Join(root, "etc/certs"),
		HTTP:        map[string]string{},
	}
	spiffe, err := pki.WorkloadID(r.cfg.TrustDomain, ns, sa)
	if err != nil {
		return pod, err
	}
	pod.SPIFFEID = spiffe.String()
	return pod, nil
}

// roleArgs is one of a pod's roles: its name, HTTP address and flags.
type roleArgs struct {
	name, http string
	args       []string
}

// podRoleArgs picks the pod's addresses (recorded in pod) and returns its roles'
// flags: sds-edge, xds-relay and the launcher, in that order.
func (r *Runner) podRoleArgs(pod *stackfile.Pod) ([]roleArgs, error) {
	ns, sa := pod.Namespace, pod.ServiceAccount
	// On the bus a pod is its service-account token, checked by the signer's callout.
	onBus := func(args ...string) []string {
		return slices.Concat([]string{"-pod", pod.ID, "-pod-root", pod.Root, "-nats-token-file", pod.TokenFile}, args)
	}
	// The roles' HTTP addresses are chosen first: the launcher is told the others'.
	http, err := r.freeAddrs(3)
	if err != nil {
		return nil, err
	}
	sdsHTTP, relayHTTP := http[0], http[1]
	sdsArgs := onBus(
		"-trust-domain", r.cfg.TrustDomain, "-namespace", ns, "-service-account", sa,
		"-token-file", pod.TokenFile, "-secret-ttl", r.cfg.LeafTTL.String(), "-output-certs", pod.OutputCerts)
	// The relay serves the pod's DNS proxy from the control plane's name table
	// (Istio's DNS capture) and its debug tap, each on a port of its own since the
	// demo pods share loopback.
	relayAddrs, err := r.freeAddrs(2)
	if err != nil {
		return nil, err
	}
	pod.DNS = relayAddrs[0]
	_, tapPort, err := net.SplitHostPort(relayAddrs[1])
	if err != nil {
		return nil, err
	}
	relayArgs := onBus("-discovery-address", r.Stack.ControlPlane.XDSAddr, "-xds-tls", "plaintext",
		"-dns-capture", "-dns-addr", pod.DNS, "-pod-namespace", ns, "-debug-tap-port", tapPort)
	envoyBin, envoyKind, err := r.envoy()
	if err != nil {
		return nil, err
	}
	addrs, err := r.freeAddrs(3)
	if err != nil {
		return nil, err
	}
	pod.Envoy, pod.Status, pod.NodeID = envoyKind, addrs[0], NodeID(pod.ID, ns)
	launcherArgs := onBus(
		"-namespace", ns, "-service-account", sa, "-instance-ip", "127.0.0.1",
		"-sds-socket", pod.SDSSocket, "-xds-socket", pod.XDSSocket, "-relay-ready-url", "http://"+relayHTTP+"/readyz",
		"-sds-ready-url", "http://"+sdsHTTP+"/readyz",
		"-envoy-binary", envoyBin, "-status-addr", addrs[0], "-envoy-admin", addrs[1], "-envoy-stats-addr", addrs[2],
		"-output-certs", pod.OutputCerts, "-drain-time", "1s",
		"-pod-metrics-urls", "http://"+sdsHTTP+"/metrics,http://"+relayHTTP+"/metrics")
	pod.HTTP["sds-edge"], pod.HTTP["xds-relay"], pod.HTTP["launcher"] = sdsHTTP, relayHTTP, http[2]
	return []roleArgs{{"sds-edge", sdsHTTP, sdsArgs}, {"xds-relay", relayHTTP, relayArgs}, {"launcher", http[2], launcherArgs}}, nil
}

// launchPod launches pod's roles: a process each, or with OneProcessPods
// one `meshagent pod` process running the three, each with its own flags.
func (r *Runner) launchPod(pod stackfile.Pod, roles []roleArgs) (*podStart, error) {
	id := pod.ID
	ps := &podStart{id: id}
	if !r.cfg.OneProcessPods {
		for _, role := range roles {
			proc, err := r.launchPodRole(pod, id+"/"+role.name, role.name, role.http, role.args...)
			if err != nil {
				return nil, err
			}
			ps.ps = append(ps.ps, proc)
		}
		return ps, nil
	}
	bin, err := supervisor.FindBinary(r.cfg.BinDir, "meshagent")
	if err != nil {
		return nil, fmt.Errorf("one-process pods need the meshagent executable (make build): %w", err)
	}
	args := []string{"pod"}
	for _, role := range roles {
		args = slices.Concat(args, []string{"--" + role.name, "-http-addr", role.http, "-nats-url", r.podNATSURL(pod)}, role.args)
	}
	// Ready when the launcher (the last role) is, which is after the other two.
	launcher := roles[len(roles)-1]
	proc := &supervisor.Process{Name: id + "/pod", Bin: bin, HTTP: launcher.http, Args: args, Env: r.podEnv(pod)}
	if err := r.launch(proc); err != nil {
		return nil, err
	}
	ps.ps = []*supervisor.Process{proc}
	return ps, nil
}

// podEnv is a demo pod's environment beyond meshctl's: one scheduler thread
// each (a pod's processes idle but for a CSR, a push and an ADS stream, and up to
// fifty pods start at once on a laptop — as a sidecar is given a CPU limit of a
// core or less). The Envoy stand-in inherits it from the launcher. A pod on the
// node tier also has its node (BUS_VIA_NODE, the downward API's spec.nodeName):
// sds-edge signs on that node's sign subject.
func (r *Runner) podEnv(pod stackfile.Pod) []string {
	env := []string{"GOMAXPROCS=1"}
	if pod.Node != "" {
		env = append(env, "BUS_VIA_NODE="+pod.Node)
	}
	return env
}

// NodeID is the Envoy node id the launcher gives a demo pod: Istio's
// type~ip~pod.namespace~domain, with the loopback address meshctl up gives every pod.
func NodeID(pod, ns string) string {
	return "sidecar~127.0.0.1~" + pod + "." + ns + "~" + ns + ".svc.cluster.local"
}

// envoy returns the Envoy the launchers run and how to say it: a real Envoy when
// one is on PATH, else the stand-in built beside the services (bin/envoy-standin).
func (r *Runner) envoy() (path, kind string, err error) {
	if p, err := exec.LookPath("envoy"); err == nil {
		return p, "Envoy " + p, nil
	}
	p, err := supervisor.FindBinary(r.cfg.BinDir, "envoy-standin")
	if err != nil {
		return "", "", fmt.Errorf("no envoy on PATH, and the stand-in: %w", err)
	}
	return p, "stand-in " + p + " (no envoy on PATH)", nil
}
