package relay_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/xds-relay/internal/relay"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestSecondRelayDoesNotStealSocket starts a second relay on a live relay's socket:
// it refuses with a clear error, and the first keeps serving Envoy.
func TestSecondRelayDoesNotStealSocket(t *testing.T) {
	up := startUpstream(t)
	up.setClusters("n1", "v1", "a")
	env := startRelay(t, upstream.Config{Address: up.addr}, nil)
	before, err := os.Lstat(env.socket)
	if err != nil {
		t.Fatal(err)
	}
	second, err := relay.New(relay.Config{Pod: testPodRef, Socket: env.socket, MaxMsgSize: 1 << 20},
		env.dialer, nil, nopPublisher{}, nil, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = second.Run(ctx)
	if err == nil || err.Error() != "another xds-relay is serving on "+env.socket {
		t.Fatalf("second relay: err = %v", err)
	}
	if second.Ready() == nil {
		t.Fatal("refused relay reports ready")
	}
	after, err := os.Lstat(env.socket)
	if err != nil || !os.SameFile(before, after) {
		t.Fatalf("first relay's socket was touched (err %v)", err)
	}
	st := openCDS(t, ctx, env.socket, "n1")
	r, err := st.Recv()
	if err != nil || r.GetVersionInfo() != "v1" {
		t.Fatalf("first relay after the refused start: %v %v", r, err)
	}
}

type nopPublisher struct{}

func (nopPublisher) Publish(string, events.Payload) {}

// TestRelayReplacesStaleSocketAndRemovesOnlyItsOwn starts a relay over a stale
// socket file, then checks shutdown leaves alone a socket that replaced its own.
func TestRelayReplacesStaleSocketAndRemovesOnlyItsOwn(t *testing.T) {
	tests := []struct {
		name     string
		replaced bool // another socket took the path while the relay ran
	}{
		{name: "own socket removed on shutdown"},
		{name: "foreign socket kept on shutdown", replaced: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(testkit.ShortDir(t), "XDS")
			testkit.StaleSocket(t, path)
			d, err := upstream.New(upstream.Config{Address: "127.0.0.1:1", Mode: upstream.Plaintext, MaxMsgSize: 1 << 20,
				ConnectTimeout: time.Second}, nil, testLog(t))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			srv, err := relay.New(relay.Config{Pod: testPodRef, Socket: path, MaxMsgSize: 1 << 20}, d, nil, nopPublisher{}, nil, testLog(t))
			if err != nil {
				t.Fatal(err)
			}
			stop := testkit.Background(t, srv.Run) // reports what Run returned
			select {
			case <-srv.Bound():
			case <-time.After(testkit.Timeout):
				t.Fatal("relay did not bind over a stale socket")
			}
			fi, err := os.Lstat(path)
			if err != nil || fi.Mode().Perm() != relay.DefaultSocketMode {
				t.Fatalf("socket %v %v", fi, err)
			}
			c, err := net.DialTimeout("unix", path, time.Second)
			if err != nil {
				t.Fatalf("relay socket does not answer: %v", err)
			}
			c.Close()
			if tt.replaced {
				_ = os.Remove(path)
				testkit.StaleSocket(t, path)
			}
			stop()
			_, err = os.Lstat(path)
			if tt.replaced && err != nil {
				t.Fatalf("shutdown removed a socket that was not its own: %v", err)
			}
			if !tt.replaced && !os.IsNotExist(err) {
				t.Fatalf("own socket left behind: %v", err)
			}
		})
	}
}
