package standin

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/tests/testkit"
)

func TestArgumentsAsEnvoy(t *testing.T) {
	var out, errw bytes.Buffer
	if Main([]string{"--version"}, &out, &errw) != 0 || !strings.Contains(out.String(), "envoy-standin version") {
		t.Fatalf("--version: %q", out.String())
	}
	for _, args := range [][]string{{"--no-such-flag"}, {"-c"}, {}, {"-c", "/nonexistent.json"}} {
		if code := Main(args, &out, &errw); code != 1 {
			t.Errorf("%v: exit %d", args, code)
		}
	}
}

// The admin API answers as Envoy's: /ready, /stats with a filter, /drain_listeners
// and /quitquitquit POST only, and /quitquitquit ends the process with 0.
func TestAdminAPI(t *testing.T) {
	admin, in := testkit.FreeAddr(t), testkit.FreeAddr(t)
	ah, ap, _ := net.SplitHostPort(admin)
	ih, ip, _ := net.SplitHostPort(in)
	cfg := filepath.Join(t.TempDir(), "b.json")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`{"node": {"id": "sidecar~x"},
	  "admin": {"address": {"socket_address": {"address": %q, "port_value": %s}}},
	  "static_resources": {"listeners": [{"name": "in", "traffic_direction": "INBOUND",
	    "address": {"socket_address": {"address": %q, "port_value": %s}}}]}}`, ah, ap, ih, ip)), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	var out bytes.Buffer
	go func() { done <- Main([]string{"-c", cfg, "--drain-time-s", "5", "--disable-hot-restart"}, &out, &out) }()
	base := "http://" + admin
	testkit.Eventually(t, "LIVE", func() bool { code, body := testkit.HTTPGet(base + "/ready"); return code == 200 && body == "LIVE\n" })
	c, err := net.Dial("tcp", in)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := "listener." + ih + "_" + ip + ".downstream_cx_active: 1"
	testkit.Eventually(t, key, func() bool {
		_, body := testkit.HTTPGet(base + "/stats?usedonly&filter=downstream_cx_active$")
		return strings.Contains(body, key) && !strings.Contains(body, "server.live")
	})
	for _, p := range []string{"/drain_listeners?graceful", "/quitquitquit"} {
		if code, _ := testkit.HTTPGet(base + p); code != http.StatusMethodNotAllowed {
			t.Errorf("GET %s: %d", p, code)
		}
	}
	resp, err := http.Post(base+"/drain_listeners?graceful&inboundonly", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("drain_listeners: %v %v", resp, err)
	}
	resp.Body.Close()
	if _, err := net.Dial("tcp", in); err == nil {
		t.Error("inbound listener still accepts after drain_listeners")
	}
	if _, err := c.Write([]byte("x")); err != nil {
		t.Errorf("open connection cut by the drain: %v", err)
	}
	resp, err = http.Post(base+"/quitquitquit", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
}
