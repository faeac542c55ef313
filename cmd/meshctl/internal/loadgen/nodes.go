package loadgen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/supervisor"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/devtoken"
)

// nodeReadyWait bounds the node tier's start: every node agent connected to
// the hub (its /readyz).
const nodeReadyWait = 2 * time.Minute

// nodeTier is a storm's node tier: one real node-agent process per simulated
// node, each a leaf node of the stack's hub admitted by its own pod- and
// node-bound token, as a DaemonSet's pod is.
type nodeTier struct {
	nodes []stackfile.Node
	procs []*nodeProc
}

type nodeProc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited
	err  error
}

// startNodeTier starts cfg.Layout.Nodes node agents, storm-node-0, ..., against
// the stack's leaf listener, and waits until each is connected to the hub.
func startNodeTier(ctx context.Context, cfg StormConfig, iss *devtoken.Issuer, work string) (t *nodeTier, err error) {
	st := cfg.Stack
	ns, sa, ok := strings.Cut(st.NodeAgentAccount, "/")
	if st.LeafURL == "" || !ok {
		return nil, errors.New("-nodes: the stack has no leaf listener or admits no node agents (stack.json leaf_url, node_agent_account): restart it with this meshctl's up")
	}
	bin, err := supervisor.FindBinary(cfg.BinDir, "node-agent")
	if err != nil {
		return nil, fmt.Errorf("-nodes: %w", err)
	}
	n := cfg.Layout.Nodes
	addrs, err := supervisor.FreeAddrs(2 * n)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(work, "nodes")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// The agents' pods are named as a DaemonSet's, afresh for each storm: the
	// hub bounds how often one pod is admitted.
	run := make([]byte, 3)
	_, _ = rand.Read(run)
	t = &nodeTier{}
	defer func() {
		if err != nil {
			t.stop()
		}
	}()
	now := time.Now()
	for i := range n {
		node := stackfile.Node{Name: fmt.Sprintf("storm-node-%d", i), Bus: addrs[2*i], HTTP: addrs[2*i+1]}
		pod := fmt.Sprintf("meshagent-node-%s-%d", hex.EncodeToString(run), i)
		tok, err := iss.MintForPodOnNode(ns, sa, pod, node.Name, st.TokenIssuer.Audience, time.Hour, now)
		if err != nil {
			return t, err
		}
		tokFile := filepath.Join(dir, node.Name+".token")
		if err := os.WriteFile(tokFile, []byte(tok), 0o600); err != nil {
			return t, err
		}
		p, err := startNodeAgent(cfg.Nice, cfg.Procs, bin, filepath.Join(dir, node.Name+".log"),
			"-node", node.Name, "-hub", st.LeafURL, "-token-file", tokFile, "-listen", node.Bus, "-http-addr", node.HTTP,
			"-trust-domain", st.TrustDomain, "-jwks-file", st.TokenIssuer.JWKS, "-token-issuer", st.TokenIssuer.Issuer, "-token-audience", st.TokenIssuer.Audience)
		if err != nil {
			return t, fmt.Errorf("node agent %s: %w", node.Name, err)
		}
		t.nodes, t.procs = append(t.nodes, node), append(t.procs, p)
	}
	return t, t.waitReady(ctx)
}

func startNodeAgent(nice, procs int, bin, logPath string, args ...string) (*nodeProc, error) {
	argv, err := niced(nice, append([]string{bin}, args...))
	if err != nil {
		return nil, err
	}
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = childAttr()
	cmd.Env = procsEnv(procs)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &nodeProc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// procsEnv is a simulated machine's environment: this one's, with GOMAXPROCS
// set to procs (nil, inherited as it is, for 0).
func procsEnv(procs int) []string {
	if procs == 0 {
		return nil
	}
	return append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(procs))
}

// niced is argv run at niceness n by nice(1), which execs it in its own process
// (the pid is argv's): every thread the child's runtime starts inherits the
// niceness, which setpriority(2) on a started Go process would not give them.
func niced(n int, argv []string) ([]string, error) {
	if n == 0 {
		return argv, nil
	}
	nice, err := exec.LookPath("nice")
	if err != nil {
		return nil, fmt.Errorf("-nice %d: %w (use -nice 0)", n, err)
	}
	return append([]string{nice, "-n", strconv.Itoa(n)}, argv...), nil
}

// childAttr keeps a storm's children (node agents, workers) out of the
// terminal's process group, so that Ctrl-C reaches meshctl, which stops them,
// and ends them if meshctl dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// waitReady polls every node agent's /readyz until each answers 200; a node
// agent that exits, or is not ready within nodeReadyWait, fails the storm
// with its log's end.
func (t *nodeTier) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, nodeReadyWait)
	defer cancel()
	errs := make([]error, len(t.procs))
	var wg sync.WaitGroup
	for i, p := range t.procs {
		wg.Go(func() {
			url := "http://" + t.nodes[i].HTTP + "/readyz"
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				if ready(ctx, url) {
					return
				}
				select {
				case <-p.done:
					errs[i] = fmt.Errorf("node agent %s exited (%v):\n%s", t.nodes[i].Name, p.err, tail(p.log))
					return
				case <-ctx.Done():
					errs[i] = fmt.Errorf("node agent %s not ready after %s:\n%s", t.nodes[i].Name, nodeReadyWait, tail(p.log))
					return
				case <-tick.C:
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func ready(ctx context.Context, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// tail is the last lines of a log file.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}

func (t *nodeTier) pids() []int {
	out := make([]int, len(t.procs))
	for i, p := range t.procs {
		out[i] = p.cmd.Process.Pid
	}
	return out
}

// admissions is the node agents' admissions so far, all together.
func (t *nodeTier) admissions() (float64, error) {
	var sum float64
	for _, n := range t.nodes {
		page, err := scrape("http://" + n.HTTP + "/metrics")
		if err != nil {
			return 0, fmt.Errorf("%s: %w", n.Name, err)
		}
		if _, ok := page["meshagent_node_admissions_total"]; !ok {
			return 0, fmt.Errorf("%s: no meshagent_node_admissions_total", n.Name)
		}
		sum += page["meshagent_node_admissions_total"]
	}
	return sum, nil
}

// stop ends every node agent (SIGTERM, then SIGKILL after 10 s).
func (t *nodeTier) stop() {
	for _, p := range t.procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	expired := false
	for _, p := range t.procs {
		if !expired {
			select {
			case <-p.done:
				continue
			case <-timer.C:
				expired = true
			}
		}
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
