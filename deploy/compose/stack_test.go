//go:build compose

package compose

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/faultcheck"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// ProjectEnv names the suite's compose project (default "meshagent-faults"), so
// that two runs on one docker engine (two checkouts, CI beside a developer) do not
// share containers, network and volumes.
const ProjectEnv = "MESHAGENT_COMPOSE_PROJECT"

// project is the suite's own compose project: `make compose-up` (project "compose")
// runs beside it.
var project = cmp.Or(os.Getenv(ProjectEnv), "meshagent-faults")

// secretTTL is the demo pod's certificate lifetime in the suite: short, so that
// expiry is reachable within a fault (issue 10 measured with 1m).
const secretTTL = time.Minute

// pod is the demo pod of compose.yaml.
const pod = "demo-0"

// podRef is the demo pod on the bus: the compose stack runs it in namespace default.
var podRef = events.PodRef{Namespace: "default", Name: pod}

// natsNodes are the compose services of the NATS cluster.
var natsNodes = []string{"nats-1", "nats-2", "nats-3"}

// stack is the suite's compose stack: free host ports, the pod's filesystem in a host
// directory (its SDS socket reachable from here), the operator's credentials in
// another.
type stack struct {
	secrets  string            // MESHAGENT_SECRETS_DIR
	podDir   string            // MESHAGENT_POD_DIR
	client   map[string]string // node -> host address of its client port
	monitor  map[string]string // node -> host address of its monitoring port
	podReady string            // sds-edge's /readyz URL
	// nodePodReady is each node-tier pod's sds-edge /readyz URL, by pod name.
	nodePodReady map[string]string
	env          []string
	// extraVolumes are docker volumes a fault made outside compose.yaml (down -v
	// does not know them), removed after down.
	extraVolumes []string
}

// newStack chooses the stack's host ports and directories; nothing runs yet.
func newStack(t *testing.T) *stack {
	s := &stack{secrets: mkdir(t, "mfs"), podDir: mkdir(t, "mfp"),
		client: map[string]string{}, monitor: map[string]string{}, nodePodReady: map[string]string{}}
	env := map[string]string{"MESHAGENT_SECRETS_DIR": s.secrets, "MESHAGENT_POD_DIR": s.podDir,
		"MESHAGENT_SECRET_TTL":       secretTTL.String(),
		"MESHAGENT_DEFAULT_CERT_TTL": secretTTL.String(), "MESHAGENT_MAX_CERT_TTL": maxCertTTL.String(),
		"MESHAGENT_ROOT_CHECK_INTERVAL": rootCheckInterval.String()}
	port := func(name string) string {
		addr := testkit.FreeAddr(t)
		_, p, _ := net.SplitHostPort(addr)
		env[name] = p
		return addr
	}
	for i, n := range natsNodes {
		suffix := fmt.Sprintf("_%d", i+1)
		if i == 0 {
			suffix = ""
		}
		s.client[n] = port("MESHAGENT_NATS" + suffix + "_PORT")
		s.monitor[n] = port("MESHAGENT_NATS" + suffix + "_MONITOR_PORT")
	}
	port("MESHAGENT_CA_PORT")
	port("MESHAGENT_DASHBOARD_PORT")
	s.podReady = "http://" + port("MESHAGENT_POD_HTTP_PORT") + "/readyz"
	for _, n := range nodes {
		s.nodePodReady[n.pod] = "http://" + port("MESHAGENT_"+strings.ToUpper(strings.ReplaceAll(n.pod, "-", "_"))+"_HTTP_PORT") + "/readyz"
	}
	s.env = os.Environ()
	for k, v := range env {
		s.env = append(s.env, k+"="+v)
	}
	return s
}

// mkdir makes a short directory under the system's temporary one (the pod's SDS
// socket path must stay under 108 bytes). The containers write into it as root, so
// it is removed after `down`, by whoever can.
func mkdir(t *testing.T, prefix string) string {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// sdsSocket is the demo pod's SDS socket on the host.
func (s *stack) sdsSocket() string {
	return filepath.Join(s.podDir, "var/run/secrets/workload-spiffe-uds/socket")
}

// compose runs docker-compose (or $COMPOSE) on the suite's project.
func (s *stack) compose(t *testing.T, args ...string) string {
	t.Helper()
	out, err := s.tryCompose(args...)
	if err != nil {
		t.Fatalf("compose %v: %v\n%s", args, err, out)
	}
	return out
}

func (s *stack) tryCompose(args ...string) (string, error) {
	bin := strings.Fields(os.Getenv("COMPOSE"))
	if len(bin) == 0 {
		bin = []string{"docker-compose"}
	}
	full := append(bin[1:], append([]string{"-p", project, "-f", "compose.yaml"}, args...)...)
	cmd := exec.Command(bin[0], full...)
	cmd.Env = s.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// container is the id of service's container.
func (s *stack) container(t *testing.T, service string) string {
	t.Helper()
	id := strings.TrimSpace(s.compose(t, "ps", "-q", service))
	if id == "" {
		t.Fatalf("no container for %s", service)
	}
	return id
}

// docker runs the docker CLI.
func docker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("docker %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// logsSince is what service's container logged in the last d (docker logs: the
// compose CLI of Debian's docker-compose 1.29 has no --since).
func (s *stack) logsSince(t *testing.T, service string, d time.Duration) string {
	t.Helper()
	out, err := exec.Command("docker", "logs", "--since", d.String(), s.container(t, service)).CombinedOutput()
	if err != nil {
		t.Fatalf("docker logs %s: %v\n%s", service, err, out)
	}
	return string(out)
}

// down removes the stack and its volumes.
//
// Docker 20.10 can leak a network's endpoint count when containers on it are
// removed, disconnected and reconnected (seen here on 2026-11-27, after every
// subtest had passed): the network has no container, yet "error while removing
// network ... has active endpoints" until dockerd restarts, and compose stops there,
// before it removes the volumes. So that one leak neither fails every later run nor
// leaves it the old run's JetStream state and secrets, down then removes the
// project's volumes itself and only logs the network, which the next up reuses.
// Anything else left (a container, a volume) fails the test.
func (s *stack) down(t *testing.T) {
	out, err := s.tryCompose("down", "-v", "--remove-orphans")
	vols := s.extraVolumes
	if err != nil && leakedNetwork.MatchString(out) {
		left := labelled(t, "ps", "-a", "-q")
		mine := labelled(t, "volume", "ls", "-q")
		vols = append(mine, vols...)
		if len(left) == 0 {
			t.Logf("compose down: docker cannot remove the stack's network (a leaked endpoint count; restarting dockerd clears it); its containers are gone, its %d volumes removed here", len(mine))
			err = nil
		}
	}
	if err != nil {
		t.Errorf("compose down: %v\n%s", err, out)
	}
	for _, v := range vols {
		if out, err := exec.Command("docker", "volume", "rm", "-f", v).CombinedOutput(); err != nil {
			t.Errorf("remove volume %s: %v\n%s", v, err, out)
		}
	}
}

// leakedNetwork is Docker's refusal to remove a network it counts endpoints on.
var leakedNetwork = regexp.MustCompile(`error while removing network: network ` + regexp.QuoteMeta(project) + `_\S+ id \w+ has active endpoints`)

// labelled lists the ids docker prints for args (ps -a -q, volume ls -q) of this
// compose project's objects.
func labelled(t *testing.T, args ...string) []string {
	t.Helper()
	return strings.Fields(docker(t, append(args, "--filter", "label=com.docker.compose.project="+project)...))
}

// removeDirs removes the host directories (after down).
func (s *stack) removeDirs(t *testing.T) {
	for _, d := range []string{s.secrets, s.podDir} {
		if err := os.RemoveAll(d); err != nil {
			t.Logf("leaving %s (written by the containers as root): %v", d, err)
		}
	}
}

// urls is every node's client address, for a connection that survives the loss of any.
func (s *stack) urls() string {
	var u []string
	for _, n := range natsNodes {
		u = append(u, "tls://"+s.client[n])
	}
	return strings.Join(u, ",")
}

// connect dials the cluster from the host over TLS with a credential from the
// secrets directory ("" for none), retrying until limit. url "" means every node.
func (s *stack) connect(t *testing.T, url, seed, inbox string, limit time.Duration, opts ...nats.Option) (*nats.Conn, error) {
	t.Helper()
	if url == "" {
		url = s.urls()
	}
	opts = append(opts, nats.RootCAs(filepath.Join(s.secrets, "ca.pem")), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond))
	if seed != "" {
		o, err := nats.NkeyOptionFromSeed(filepath.Join(s.secrets, seed))
		if err != nil {
			return nil, err
		}
		opts = append(opts, o, nats.CustomInboxPrefix(inbox))
	}
	deadline := time.Now().Add(limit)
	retry := time.NewTicker(500 * time.Millisecond)
	defer retry.Stop()
	for {
		nc, err := nats.Connect(url, opts...)
		if err == nil || time.Now().After(deadline) {
			return nc, err
		}
		<-retry.C
	}
}

// monitorGet reads one of node's monitoring endpoints (published on the host's loopback).
func (s *stack) monitorGet(node, path string, v any) error {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://" + s.monitor[node] + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return errors.Join(err, fmt.Errorf("status %s", resp.Status))
	}
	return nil
}

// metaLeader is the JetStream meta leader as the first live node sees it.
func (s *stack) metaLeader(t *testing.T) string {
	t.Helper()
	var leader string
	testkit.EventuallyWithin(t, time.Minute, "a JetStream meta leader", func() bool {
		for _, n := range natsNodes {
			var jsz struct {
				Meta struct {
					Leader string `json:"leader"`
				} `json:"meta_cluster"`
			}
			if s.monitorGet(n, "/jsz", &jsz) == nil && jsz.Meta.Leader != "" {
				leader = jsz.Meta.Leader
				return true
			}
		}
		return false
	})
	return leader
}

// forceRenew tells demo-0 to renew now.
func forceRenew(t *testing.T, nc *nats.Conn) {
	if err := faultcheck.ForceRenew(nc, podRef); err != nil {
		t.Logf("force renewal: %v", err)
	}
}

// bundle asks the signers for the trust bundle, as the admin, until they answer.
func bundle(t *testing.T, nc *nats.Conn) events.BundleReply {
	t.Helper()
	var b events.BundleReply
	testkit.EventuallyWithin(t, time.Minute, "the signers' trust bundle", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		b, err = faultcheck.Bundle(ctx, nc)
		return err == nil
	})
	return b
}
