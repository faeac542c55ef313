package faults

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/faultcheck"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// The nodes' client liveness, as deploy/compose's nats.conf sets it.
const (
	pingInterval = 3 * time.Second
	pingMax      = 2
)

// cluster is three nats-servers with JetStream, clustered over loopback ports, each
// of which can be killed and started again on the same ports and state. They run
// in the test's process, or (newProcessCluster) each as a process of its own, which
// can also be frozen (SIGSTOP) alone.
type cluster struct {
	t       *testing.T
	names   []string
	client  map[string]string // name -> host:port of its client listener
	route   map[string]string // name -> host:port of its cluster listener
	monitor map[string]string // name -> host:port of its monitoring listener (processes only)
	dir     string
	bin     string // the nats-server binary the nodes run as; "" in process
	mu      sync.Mutex
	running map[string]*server.Server
	procs   map[string]*proc
}

func startCluster(t *testing.T) *cluster {
	c := newCluster(t)
	c.startAll(c.names...)
	return c
}

// newCluster lays out the three nodes' addresses and starts none.
func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, names: []string{"n1", "n2", "n3"}, client: map[string]string{}, route: map[string]string{},
		monitor: map[string]string{}, dir: t.TempDir(), running: map[string]*server.Server{}, procs: map[string]*proc{}}
	for _, n := range c.names {
		c.client[n], c.route[n], c.monitor[n] = testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)
	}
	t.Cleanup(func() {
		for _, n := range c.names {
			c.kill(n)
		}
	})
	return c
}

// startAll starts these nodes together: routes form only when their peers are up.
func (c *cluster) startAll(names ...string) {
	var wg sync.WaitGroup
	for _, n := range names {
		wg.Add(1)
		go func() { defer wg.Done(); c.start(n) }()
	}
	wg.Wait()
}

func hostPort(t *testing.T, addr string) (string, int) {
	host, p, err := net.SplitHostPort(addr)
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil {
		t.Fatalf("address %q: %v %v", addr, err, perr)
	}
	return host, port
}

// start starts node n (again), with its JetStream state from before.
func (c *cluster) start(n string) {
	if c.bin != "" {
		c.startProcess(n)
		return
	}
	host, port := hostPort(c.t, c.client[n])
	rhost, rport := hostPort(c.t, c.route[n])
	var routes []string
	for _, o := range c.names {
		if o != n {
			routes = append(routes, "nats-route://"+c.route[o])
		}
	}
	opts := &server.Options{ServerName: n, Host: host, Port: port, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: filepath.Join(c.dir, n),
		// deploy/compose's nats.conf: a frozen client (a SIGSTOPped signer still
		// in the sign queue group) is dropped after pingInterval x (pingMax+1).
		PingInterval: pingInterval, MaxPingsOut: pingMax,
		Cluster: server.ClusterOpts{Name: "faults", Host: rhost, Port: rport},
		Routes:  server.RoutesFromStr(strings.Join(routes, ","))}
	s, err := server.NewServer(opts)
	if err != nil {
		c.t.Errorf("start %s: %v", n, err)
		return
	}
	s.Start()
	if !s.ReadyForConnections(time.Minute) { // three servers under -race on a busy machine
		c.t.Errorf("%s not ready for connections", n)
	}
	c.mu.Lock()
	c.running[n] = s
	c.mu.Unlock()
}

// kill shuts node n down, if it runs.
func (c *cluster) kill(n string) {
	c.mu.Lock()
	s, p := c.running[n], c.procs[n]
	delete(c.running, n)
	delete(c.procs, n)
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
	if p != nil {
		_ = p.cmd.Process.Signal(syscall.SIGCONT) // a frozen node takes no other signal
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// urls is every node's client URL, for a connection that survives the loss of any.
func (c *cluster) urls() string {
	var u []string
	for _, n := range c.names {
		u = append(u, "nats://"+c.client[n])
	}
	return strings.Join(u, ",")
}

// metaLeader is the node leading the JetStream meta group, "" while none does.
func (c *cluster) metaLeader() string {
	if c.bin != "" {
		return c.processMetaLeader()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for n, s := range c.running {
		if s.JetStreamIsLeader() {
			return n
		}
	}
	return ""
}

// startWatchedCluster starts the 3-node cluster, connects to it (reconnecting
// forever), waits for a JetStream meta leader, and starts the ledger of what the
// stream stores: what every fault test begins with.
func startWatchedCluster(t *testing.T) (*cluster, *nats.Conn, *faultcheck.Ledger) {
	t.Helper()
	c := startCluster(t)
	nc, err := nats.Connect(c.urls(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	testkit.EventuallyWithin(t, time.Minute, "a JetStream meta leader", func() bool { return c.metaLeader() != "" })
	ledger, err := faultcheck.NewLedger(nc)
	if err != nil {
		t.Fatal(err)
	}
	return c, nc, ledger
}

// newProcessCluster lays out the three nodes as nats-server processes (the binary
// built from the module) with the options start gives an in-process node, and starts
// none.
func newProcessCluster(t *testing.T) *cluster {
	c := newCluster(t)
	c.bin = natsServerBin
	return c
}

// startProcess starts node n as a nats-server process, with its JetStream state from
// before, and waits until it is healthy.
func (c *cluster) startProcess(n string) {
	var routes []string
	for _, o := range c.names {
		if o != n {
			routes = append(routes, fmt.Sprintf("%q", "nats-route://"+c.route[o]))
		}
	}
	conf := filepath.Join(c.dir, n+".conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, `server_name: %s
listen: %q
http: %q
ping_interval: "%s"
ping_max: %d
jetstream { store_dir: %q }
cluster { name: faults, listen: %q, routes: [%s] }
`, n, c.client[n], c.monitor[n], pingInterval, pingMax, filepath.Join(c.dir, n), c.route[n], strings.Join(routes, ", ")), 0o600); err != nil {
		c.t.Errorf("config of %s: %v", n, err)
		return
	}
	p := runArgs(c.t, "nats-"+n, c.bin, []string{"-c", conf})
	c.mu.Lock()
	c.procs[n] = p
	c.mu.Unlock()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get("http://" + c.monitor[n] + "/healthz?js-enabled-only=true")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if p.exited() || time.Now().After(deadline) {
			c.t.Errorf("%s not healthy: %v\n%s", n, err, p.output())
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// freeze stops node n's process (SIGSTOP): its sockets stay open, its peers and
// clients notice only when their pings go unanswered. resume continues it.
func (c *cluster) freeze(n string) { c.signal(n, syscall.SIGSTOP) }
func (c *cluster) resume(n string) { c.signal(n, syscall.SIGCONT) }

func (c *cluster) signal(n string, sig syscall.Signal) {
	c.mu.Lock()
	p := c.procs[n]
	c.mu.Unlock()
	if p == nil {
		c.t.Fatalf("%s does not run as a process", n)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("signal %s: %v", n, err)
	}
}

// processMetaLeader asks the running nodes' monitoring (/jsz) for the meta leader.
func (c *cluster) processMetaLeader() string {
	c.mu.Lock()
	var names []string
	for n := range c.procs {
		names = append(names, n)
	}
	c.mu.Unlock()
	client := http.Client{Timeout: time.Second} // a frozen node does not answer
	for _, n := range names {
		resp, err := client.Get("http://" + c.monitor[n] + "/jsz")
		if err != nil {
			continue
		}
		var jsz struct {
			Meta struct {
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
		}
		err = json.NewDecoder(resp.Body).Decode(&jsz)
		_ = resp.Body.Close()
		if err == nil && jsz.Meta.Leader != "" {
			return jsz.Meta.Leader
		}
	}
	return ""
}
