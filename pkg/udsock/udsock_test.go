package udsock

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/testkit"
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

// TestListenModeIsNeverLooser binds repeatedly while another goroutine watches the
// path: the socket must never be seen there with any mode but the configured one.
func TestListenModeIsNeverLooser(t *testing.T) {
	for _, mode := range []os.FileMode{0o600, 0o660, 0o700} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := testkit.ShortDir(t)
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
				ln, err := Listen(path, mode)
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
				if _, err := os.Lstat(path); !os.IsNotExist(err) {
					t.Fatalf("Close left the socket behind: %v", err)
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
		inUse   bool   // the error is ErrInUse
	}{
		{
			name:    "nothing there",
			prepare: func(t *testing.T, path string) func(*testing.T) { return func(*testing.T) {} },
		},
		{
			name: "stale socket is replaced",
			prepare: func(t *testing.T, path string) func(*testing.T) {
				testkit.StaleSocket(t, path)
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
			wantErr: "another server is serving on ",
			inUse:   true,
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
			dir := testkit.ShortDir(t)
			path := filepath.Join(dir, "XDS")
			check := tt.prepare(t, path)
			ln, err := Listen(path, 0o600)
			if tt.wantErr != "" {
				if err == nil {
					ln.Close()
					t.Fatal("Listen succeeded, want an error")
				}
				if !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), path) {
					t.Fatalf("err = %v, want %q naming %s", err, tt.wantErr, path)
				}
				if errors.Is(err, ErrInUse) != tt.inUse {
					t.Fatalf("errors.Is(%v, ErrInUse) = %v, want %v", err, !tt.inUse, tt.inUse)
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

// TestCloseRemovesOnlyItsOwnSocket: Close removes the socket it bound, but not a
// socket that has taken the path since (a second server after a manual rm).
func TestCloseRemovesOnlyItsOwnSocket(t *testing.T) {
	for _, replaced := range []bool{false, true} {
		t.Run(map[bool]string{false: "own", true: "replaced"}[replaced], func(t *testing.T) {
			path := filepath.Join(testkit.ShortDir(t), "S")
			ln, err := Listen(path, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			if replaced {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				testkit.StaleSocket(t, path)
			}
			if err := ln.Close(); err != nil {
				t.Fatal(err)
			}
			_, err = os.Lstat(path)
			if replaced && err != nil {
				t.Fatalf("Close removed a socket that was not its own: %v", err)
			}
			if !replaced && !os.IsNotExist(err) {
				t.Fatalf("own socket left behind: %v", err)
			}
		})
	}
}

func TestLive(t *testing.T) {
	dir := testkit.ShortDir(t)
	live := filepath.Join(dir, "live")
	ln, err := Listen(live, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	stale := filepath.Join(dir, "stale")
	testkit.StaleSocket(t, stale)
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		path    string
		want    bool
		wantErr bool
	}{
		{"live", live, true, false},
		{"stale", stale, false, false},
		{"absent", filepath.Join(dir, "none"), false, false},
		{"not a socket", file, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Live(context.Background(), tt.path)
			if got != tt.want || (err != nil) != tt.wantErr {
				t.Fatalf("Live(%s) = %v, %v; want %v, error %v", tt.name, got, err, tt.want, tt.wantErr)
			}
		})
	}
	if _, err := os.Lstat(stale); err != nil {
		t.Fatalf("Live touched the stale socket: %v", err)
	}
}
