package relay_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/xds-relay/internal/relay"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"

)

// onlyEntry fails unless dir holds exactly name: no temporary file or directory is left.
func onlyEntry(t *testing.T, dir, name string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != 1 || names[0] != name {
		t.Fatalf("dir holds %v, want only %q", names, name)
	}
}

// staleSocket leaves a socket file at path that nothing listens on, as a killed relay does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
}

// TestListenModeIsNeverLooser binds repeatedly while another goroutine watches the
// path: the socket must never be seen there with any mode but the configured one.
func TestListenModeIsNeverLooser(t *testing.T) {
	for _, mode := range []os.FileMode{0o600, 0o660, 0o700} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := shortDir(t)
			path := filepath.Join(dir, "XDS")
			stop := make(chan struct{})
			var (
				wg    sync.WaitGroup
				bad   int
				first os.FileMode
				seen  int
			)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if fi, err := os.Lstat(path); err == nil {
						seen++
						if fi.Mode().Perm() != mode {
							if bad == 0 {
								first = fi.Mode()
							}
							bad++
						}
					}
				}
			}()
			for range 50 {
				ln, err := relay.Listen(path, mode)
				if err != nil {
					t.Fatal(err)
				}
				fi, err := os.Lstat(path)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != mode {
					t.Fatalf("right after Listen: mode %v, want a %v socket", fi.Mode(), mode)
				}
				onlyEntry(t, dir, "XDS")
				ln.Close()
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			}
			close(stop)
			wg.Wait()
			if bad > 0 {
				t.Fatalf("socket observed %d times with a wrong mode, first %v (want only %v)", bad, first, mode)
			}
			t.Logf("watcher saw the socket %d times", seen)
		})
	}
}

func TestListenExistingPath(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, path string) (check func(t *testing.T))
		wantErr string // "" means Listen succeeds
	}{
		{
			name:    "nothing there",
			prepare: func(t *testing.T, path string) func(*testing.T) { return func(*testing.T) {} },
		},
		{
			name: "stale socket is replaced",
			prepare: func(t *testing.T, path string) func(*testing.T) {
				staleSocket(t, path)
				old, err := os.Lstat(path)
				if err != nil {
					t.Fatal(err)
				}
				return func(t *testing.T) {
					fi, err := os.Lstat(path)
					if err != nil || os.SameFile(fi, old) {
						t.Fatalf("stale socket not replaced (err %v)", err)
					}
				}
			},
		},
		{
			name:    "live socket is not stolen",
			wantErr: "another xds-relay is serving on ",
			prepare: func(t *testing.T, path string) func(*testing.T) {
				other, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { other.Close() })
				return func(t *testing.T) {
					// The other listener still owns path and still takes connections.
					c, err := net.DialTimeout("unix", path, time.Second)
					if err != nil {
						t.Fatalf("other listener no longer reachable: %v", err)
					}
					defer c.Close()
					_ = other.SetDeadline(time.Now().Add(5 * time.Second))
					for range 2 { // the probe, then ours
						a, err := other.Accept()
						if err != nil {
							t.Fatalf("other listener: %v", err)
						}
						a.Close()
					}
				}
			},
		},
		{
			name:    "regular file is left alone",
			wantErr: "exists and is not a socket",
			prepare: func(t *testing.T, path string) func(*testing.T) {
				if err := os.WriteFile(path, []byte("keep"), 0o644); err != nil {
					t.Fatal(err)
				}
				return func(t *testing.T) {
					if b, err := os.ReadFile(path); err != nil || string(b) != "keep" {
						t.Fatalf("file changed: %q %v", b, err)
					}
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := shortDir(t)
			path := filepath.Join(dir, "XDS")
			check := tt.prepare(t, path)
			ln, err := relay.Listen(path, relay.DefaultSocketMode)
			if tt.wantErr != "" {
				if err == nil {
					ln.Close()
					t.Fatal("Listen succeeded, want an error")
				}
				if !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), path) {
					t.Fatalf("err = %v, want %q naming %s", err, tt.wantErr, path)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				c, err := net.DialTimeout("unix", path, time.Second)
				if err != nil {
					t.Fatalf("new socket does not answer: %v", err)
				}
				c.Close()
			}
			check(t)
			onlyEntry(t, dir, "XDS")
		})
	}
}

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
	second, err := relay.New(relay.Config{Pod: testPod, Socket: env.socket, MaxMsgSize: 1 << 20},
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
			path := filepath.Join(shortDir(t), "XDS")
			staleSocket(t, path)
			d, err := upstream.New(upstream.Config{Address: "127.0.0.1:1", Mode: upstream.Plaintext, MaxMsgSize: 1 << 20,
				ConnectTimeout: time.Second}, nil, testLog(t))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			srv, err := relay.New(relay.Config{Pod: testPod, Socket: path, MaxMsgSize: 1 << 20}, d, nil, nopPublisher{}, nil, testLog(t))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Run(ctx) }()
			select {
			case <-srv.Bound():
			case err := <-done:
				cancel()
				t.Fatalf("relay did not start over a stale socket: %v", err)
			case <-time.After(5 * time.Second):
				cancel()
				t.Fatal("relay did not bind")
			}
			fi, err := os.Lstat(path)
			if err != nil || fi.Mode().Perm() != relay.DefaultSocketMode {
				cancel()
				t.Fatalf("socket %v %v", fi, err)
			}
			c, err := net.DialTimeout("unix", path, time.Second)
			if err != nil {
				cancel()
				t.Fatalf("relay socket does not answer: %v", err)
			}
			c.Close()
			if tt.replaced {
				_ = os.Remove(path)
				staleSocket(t, path)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("run: %v", err)
			}
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
