package faults

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/tests/faultcheck"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// binDir holds the service binaries: $MESHAGENT_BIN (make's bin/) or built by TestMain.
var binDir string

// natsServerBin is a nats-server binary built from the module (the version this
// module requires), for a node that runs as a process of its own: $MESHAGENT_BIN's
// (make images builds it there) or built by TestMain.
var natsServerBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		binDir = os.Getenv("MESHAGENT_BIN")
		if binDir != "" {
			natsServerBin = filepath.Join(binDir, "nats-server")
		}
		var dir string
		if binDir == "" || !exists(natsServerBin) {
			var err error
			if dir, err = os.MkdirTemp("", "faultsbin"); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
		}
		if binDir == "" {
			if err := testkit.BuildServices(dir, "signer", "rotator", "sds-edge"); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			binDir = dir
		}
		if !exists(natsServerBin) {
			natsServerBin = filepath.Join(dir, "nats-server")
			cmd := exec.Command("go", "build", "-trimpath", "-o", natsServerBin, "github.com/nats-io/nats-server/v2")
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "build nats-server: %v\n%s", err, out)
				return 1
			}
		}
		return m.Run()
	}())
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return path != "" && err == nil
}

// proc is one service process; its output goes to a file shown when the test fails.
type proc struct {
	name, log string
	cmd       *exec.Cmd
	done      chan struct{}
}

// run starts binary bin with env (on top of PATH and HOME only), stopped with SIGTERM
// when the test ends.
func run(t *testing.T, name, bin string, env ...string) *proc {
	t.Helper()
	return runArgs(t, name, filepath.Join(binDir, bin), nil, env...)
}

// runArgs starts the program at path with args, as run does.
func runArgs(t *testing.T, name, path string, args []string, env ...string) *proc {
	t.Helper()
	p := &proc{name: name, log: filepath.Join(t.TempDir(), name+".log"), done: make(chan struct{})}
	out, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "LOG_LEVEL=debug"}, env...)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); _ = out.Close(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- %s output (the end):\n%s", name, p.output())
		}
	})
	return p
}

// output is the end of the process's output.
func (p *proc) output() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return strings.TrimSpace(string(b))
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// fleet is the services on the cluster: a signer, a rotator and one pod's sds-edge,
// configured through their environment as deploy/compose/compose.yaml does.
type fleet struct {
	podRoot, socket string
	procs           []*proc
	signers         []*proc
	signerHTTP      []string // each signer's HTTP address, as signers
	iss             *devtoken.Issuer
	sdsEnv          []string // sds-edge's environment, to start it again
}

// layout says which NATS URLs each part connects to: one signer per entry of
// signers; the rotator and the pod take the pod's.
type layout struct {
	signers []string
	pod     string
}

const (
	pod       = "demo-0"
	secretTTL = time.Minute
)

func startFleet(t *testing.T, c *cluster) *fleet {
	t.Helper()
	return startFleetAs(t, c, layout{signers: []string{c.urls()}, pod: c.urls()})
}

// startFleetAs starts the fleet connected as l says.
func startFleetAs(t *testing.T, c *cluster, l layout) *fleet {
	t.Helper()
	dir := t.TempDir()
	iss, err := devtoken.LoadOrCreate(filepath.Join(dir, "issuer"))
	if err != nil {
		t.Fatal(err)
	}
	kek := filepath.Join(dir, "ca-kek")
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if err := os.WriteFile(kek, key, 0o600); err != nil {
		t.Fatal(err)
	}
	f := &fleet{podRoot: testkit.ShortDir(t), iss: iss}
	f.socket = filepath.Join(f.podRoot, "var/run/secrets/workload-spiffe-uds/socket")
	token := filepath.Join(f.podRoot, "var/run/secrets/tokens/istio-token")
	tok, err := iss.MintForPod("default", "demo", pod, devtoken.DefaultAudience, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(token), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(token, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	for n, url := range l.signers {
		addr := testkit.FreeAddr(t)
		p := run(t, fmt.Sprintf("signer-%d", n+1), "signer", "NATS_URL="+url, "TRUST_DOMAIN=cluster.local",
			fmt.Sprintf("SIGNER_INSTANCE=signer-%d", n+1), "CA_KEK_FILE="+kek,
			"JWKS_FILE="+devtoken.JWKSPath(filepath.Join(dir, "issuer")), "TOKEN_ISSUER="+iss.Name,
			"TOKEN_AUDIENCE="+devtoken.DefaultAudience, "CA_KV_REPLICAS=3", "EVENTS_REPLICAS=3",
			"GRPC_ADDR="+testkit.FreeAddr(t), "HTTP_ADDR="+addr)
		f.procs, f.signers, f.signerHTTP = append(f.procs, p), append(f.signers, p), append(f.signerHTTP, addr)
	}
	bus := []string{"NATS_URL=" + l.pod, "TRUST_DOMAIN=cluster.local"}
	f.sdsEnv = append(slices.Clone(bus), "POD_NAME="+pod, "POD_ROOT="+f.podRoot, "POD_NAMESPACE=default",
		"SERVICE_ACCOUNT=demo", "SECRET_TTL="+secretTTL.String(), "HTTP_ADDR="+testkit.FreeAddr(t))
	f.procs = append(f.procs,
		run(t, "rotator", "rotator", append(bus, "ROTATOR_INSTANCE=rotator-1", "ROTATOR_JS_REPLICAS=3",
			"HTTP_ADDR="+testkit.FreeAddr(t))...),
		run(t, "sds-edge", "sds-edge", f.sdsEnv...),
	)
	return f
}

// alive fails the test when a service has exited: a fault must not take a process down.
func (f *fleet) alive(t *testing.T) {
	t.Helper()
	for _, p := range f.procs {
		if p.exited() {
			t.Fatalf("%s exited: %s", p.name, p.output())
		}
	}
}

// bundleCtx is a short deadline for one bus request.
func bundleCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 3*time.Second)
}

// watchReadyFleet watches the fleet's pod over SDS until it serves its first
// certificate and every signer is ready, with the cluster whole; the watch ends
// with the test.
func watchReadyFleet(t *testing.T, f *fleet, nc *nats.Conn) *faultcheck.PodWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	watch := faultcheck.WatchPod(ctx, f.socket, "faults~"+pod, "", 100*time.Millisecond)
	testkit.EventuallyWithin(t, time.Minute, "the pod's first certificate and both signers ready", func() bool {
		f.alive(t)
		for _, a := range f.signerHTTP {
			if code, _ := testkit.HTTPGet("http://" + a + "/readyz"); code != 200 {
				return false
			}
		}
		return watch.Now().Cur.Leaf != nil
	})
	whole(t, nc)
	return watch
}
