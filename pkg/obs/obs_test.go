package obs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/buildinfo"
	"github.com/prometheus/client_golang/prometheus"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestServerEndpoints(t *testing.T) {
	s := NewServer("127.0.0.1:0", hclog.NewNullLogger())
	var ready atomic.Bool
	s.AddReadyCheck("ca", func() error {
		if !ready.Load() {
			return errors.New("no root yet")
		}
		return nil
	})
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "meshagent_test_total", Help: "t"})
	s.Registry().MustRegister(c)
	c.Add(3)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Bound():
	case err := <-done:
		t.Fatal(err)
	}
	base := "http://" + s.Addr().String()
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	// It names the binary's version (meshctl status shows it).
	if resp, err := http.Get(base + "/healthz"); err != nil || resp.Header.Get(buildinfo.Header) != buildinfo.Get() || buildinfo.Get() == "" {
		t.Fatalf("healthz version header: %v", err)
	} else {
		resp.Body.Close()
	}
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "ca: no root yet") {
		t.Fatalf("readyz %d %q", code, body)
	}
	ready.Store(true)
	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("readyz after ready %d", code)
	}
	if _, body := get(t, base+"/metrics"); !strings.Contains(body, "meshagent_test_total 3") {
		t.Fatalf("metrics missing counter:\n%s", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestLoggerJSONAndLevel(t *testing.T) {
	if err := (LogConfig{Level: "loud"}).Validate(); err == nil {
		t.Fatal("bad level accepted")
	}
	var buf bytes.Buffer
	l := NewLogger("svc", LogConfig{Level: "warn", JSON: true}, &buf)
	l.Info("hidden")
	l.Warn("shown", "k", "v")
	out := buf.String()
	if strings.Contains(out, "hidden") || !strings.Contains(out, `"@message":"shown"`) || !strings.Contains(out, `"k":"v"`) {
		t.Fatalf("log output %q", out)
	}
}

// TestHandleMountsBesideTheOwnEndpoints: a page mounted at "/" answers every other
// path, while /healthz, /readyz and /metrics stay the server's own.
func TestHandleMountsBesideTheOwnEndpoints(t *testing.T) {
	s := NewServer("127.0.0.1:0", hclog.NewNullLogger())
	s.AddReadyCheck("page", func() error { return errors.New("not yet") })
	s.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "page "+r.URL.Path)
	}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-s.Bound():
	case err := <-done:
		t.Fatal(err)
	}
	base := "http://" + s.Addr().String()
	for path, want := range map[string]string{"/": "page /", "/api/x": "page /api/x", "/healthz": "ok\n",
		"/readyz": "page: not yet\n", "/metrics": "go_goroutines"} {
		if _, body := get(t, base+path); !strings.Contains(body, want) {
			t.Errorf("%s: %q, want %q", path, body, want)
		}
	}
}
