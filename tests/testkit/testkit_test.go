package testkit

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB that records a Fatalf instead of ending the test, so
// that a failing Eventually can itself be tested.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	r := &recorder{TB: t}
	Eventually(r, "the third call", func() bool { return calls.Add(1) >= 3 })
	if r.failed != "" {
		t.Fatalf("failed: %s", r.failed)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}
}

func TestEventuallyWithinFailsNamingWhatItWaitedFor(t *testing.T) {
	r := &recorder{TB: t}
	start := time.Now()
	EventuallyWithin(r, 50*time.Millisecond, "the moon", func() bool { return false })
	if took := time.Since(start); took < 50*time.Millisecond || took > 5*time.Second {
		t.Fatalf("gave up after %s, want about 50ms", took)
	}
	if want := "timed out after 50ms waiting for the moon"; r.failed != want {
		t.Fatalf("message %q, want %q", r.failed, want)
	}
}

func TestFreeAddrCanBeListenedOn(t *testing.T) {
	addr := FreeAddr(t)
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("addr %q is not loopback", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	ln.Close()
	// Outside the kernel's ephemeral range, where outgoing connections take ports.
	_, p, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(p)
	if low, high := freePortRange(); port < low || port >= high {
		t.Fatalf("port %d outside [%d, %d)", port, low, high)
	}
}

func TestHTTPGet(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		fmt.Fprint(w, "short and stout")
	}))
	code, body := HTTPGet(srv.URL)
	srv.Close()
	if code != http.StatusTeapot || body != "short and stout" {
		t.Fatalf("HTTPGet = %d %q", code, body)
	}
	if code, body := HTTPGet(srv.URL); code != 0 || body == "" {
		t.Fatalf("HTTPGet of a closed server = %d %q, want 0 and the error", code, body)
	}
}

func TestShortDirHoldsASocket(t *testing.T) {
	var dir string
	t.Run("a test with a long name, as table tests have, that would overflow sun_path", func(t *testing.T) {
		dir = ShortDir(t)
		ln, err := net.Listen("unix", dir+"/some-socket-name.sock")
		if err != nil {
			t.Fatal(err)
		}
		ln.Close()
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("ShortDir %s not removed after the test: %v", dir, err)
	}
}

func TestStaleSocketRefusesConnections(t *testing.T) {
	path := ShortDir(t) + "/s"
	StaleSocket(t, path)
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("no socket file at %s: %v", path, err)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		t.Fatal("a stale socket accepted a connection")
	}
}

// A port handed out and not yet bound looks free again: FreeAddr never hands it
// out twice in one process. The control: a port set refuses a port it holds.
func TestFreeAddrHandsOutAPortOnce(t *testing.T) {
	seen := map[string]bool{}
	for range 2000 {
		a := FreeAddr(t)
		if seen[a] {
			t.Fatalf("%s handed out twice", a)
		}
		seen[a] = true
	}
	s := &portSet{m: map[int]bool{}}
	if !s.take(12345) || s.take(12345) {
		t.Fatal("a port set took the same port twice, or refused a new one")
	}
}
