package appprobe

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func split(t *testing.T, a net.Addr) (string, int) {
	t.Helper()
	h, p, err := net.SplitHostPort(a.String())
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return h, n
}

// An HTTPS probe does not verify the app's certificate (as the kubelet's); a
// redirect is a success of its own, not followed; a User-Agent header given
// replaces the default one; a status outside 200-399 is ErrStatus with the code.
func TestHTTP(t *testing.T) {
	app := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/moved":
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		case r.URL.Path == "/ready" && r.UserAgent() == "custom" && len(r.Header.Values("User-Agent")) == 1:
		default:
			http.Error(w, "no", http.StatusServiceUnavailable)
		}
	}))
	defer app.Close()
	host, port := split(t, app.Listener.Addr())
	g := HTTPGet{Scheme: "HTTPS", Host: host, Port: port, Path: "ready", UserAgent: "probe", Headers: []Header{{Name: "user-agent", Value: "custom"}}}
	if code, err := HTTP(context.Background(), g); err != nil || code != http.StatusOK {
		t.Fatalf("ready: %d %v", code, err)
	}
	g.Path = "/moved"
	if code, err := HTTP(context.Background(), g); err != nil || code != http.StatusFound {
		t.Fatalf("redirect: %d %v", code, err)
	}
	g.Path, g.Headers = "/ready", nil
	if code, err := HTTP(context.Background(), g); !errors.Is(err, ErrStatus) || code != http.StatusServiceUnavailable {
		t.Fatalf("default user agent: %d %v, want 503 and ErrStatus", code, err)
	}
}

// An exec probe that outlives its context is killed and says it timed out.
func TestExec(t *testing.T) {
	if err := Exec(context.Background(), []string{"true"}); err != nil {
		t.Fatal(err)
	}
	if err := Exec(context.Background(), nil); err == nil {
		t.Fatal("no command ran")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := Exec(ctx, []string{"sleep", "30"}); err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("a hanging command: %v", err)
	}
}
