package faults

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/faultcheck"
	"github.com/meshagent/meshagent/pkg/testkit"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// The nodes' client liveness, as deploy/compose's nats.conf sets it.
const (
	pingInterval = 3 * time.Second
	pingMax      = 2
)

// cluster is three nats-servers with JetStream, clustered over loopback ports, each
// of which can be killed and started again on the same ports and state.
type cluster struct {
	t       *testing.T
	names   []string
	client  map[string]string // name -> host:port of its client listener
	route   map[string]string // name -> host:port of its cluster listener
	dir     string
	mu      sync.Mutex
	running map[string]*server.Server
}

func startCluster(t *testing.T) *cluster {
	c := newCluster(t)
	c.startAll(c.names...)
	return c
}

// newCluster lays out the three nodes' addresses and starts none.
func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, names: []string{"n1", "n2", "n3"}, client: map[string]string{}, route: map[string]string{},
		dir: t.TempDir(), running: map[string]*server.Server{}}
	for _, n := range c.names {
		c.client[n], c.route[n] = testkit.FreeAddr(t), testkit.FreeAddr(t)
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
	s := c.running[n]
	delete(c.running, n)
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
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
