package lifecycle

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// Three roles of one pod connecting at once with the same bus config hold one
// connection on the server, also when one of them (the launcher) connects in the
// background and the others wait for the bus; a role of another pod (another
// inbox) gets its own; the shared connection lives until its last user releases it.
func TestSharedBusOneConnectionPerPod(t *testing.T) {
	s := bustest.Server(t)
	shared := &SharedBus{}
	cfg := bus.Config{URL: s.ClientURL(), Name: "pod", Pod: "default/web-1", InboxPrefix: "_INBOX.pod.default.web-1", ConnectWait: 10 * time.Second}
	var mu sync.Mutex
	var conns []*nats.Conn
	var releases []func()
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cfg
			c.Background = i == 0
			nc, release, err := shared.Connect(context.Background(), c, hclog.NewNullLogger())
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			conns, releases = append(conns, nc), append(releases, release)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if conns[0] != conns[1] || conns[1] != conns[2] {
		t.Fatal("one pod's roles got different connections")
	}
	if n := s.NumClients(); n != 1 {
		t.Fatalf("server holds %d connections for one pod's three roles", n)
	}
	other := cfg
	other.Pod, other.InboxPrefix = "default/web-2", "_INBOX.pod.default.web-2"
	nc2, release2, err := shared.Connect(context.Background(), other, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	if nc2 == conns[0] || s.NumClients() != 2 {
		t.Fatalf("another pod shares the first pod's connection (server holds %d)", s.NumClients())
	}
	releases[0]()
	releases[0]() // twice is once
	releases[1]()
	if conns[0].IsClosed() || !conns[0].IsConnected() {
		t.Fatal("the shared connection closed while a role still uses it")
	}
	releases[2]()
	if !conns[0].IsClosed() {
		t.Fatal("the shared connection outlived its last user")
	}
	testkit.Eventually(t, "server sees one connection", func() bool { return s.NumClients() == 1 })
	release2()
	// A config used again after its connection closed gets a new one.
	nc3, release3, err := shared.Connect(context.Background(), cfg, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer release3()
	if nc3 == conns[0] || !nc3.IsConnected() {
		t.Fatal("a closed shared connection handed out again")
	}
}

// A first connect that fails is the error of the roles waiting on it, and a later
// connect tries again.
func TestSharedBusFailedConnectIsEveryWaitersError(t *testing.T) {
	shared := &SharedBus{}
	cfg := bus.Config{URL: "nats://127.0.0.1:1", ConnectWait: 300 * time.Millisecond}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := shared.Connect(context.Background(), cfg, hclog.NewNullLogger())
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err == nil {
			t.Fatal("connected to nothing")
		}
	}
	shared.mu.Lock()
	left := len(shared.conns)
	shared.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d failed connections kept", left)
	}
}
