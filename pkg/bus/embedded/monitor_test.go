package embedded

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// A monitoring port of -1 picks a free one, which serves /varz.
func TestMonitorPortServesVarz(t *testing.T) {
	s, err := Start(Config{Port: -1, MonitorPort: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	addr := MonitorAddr(s)
	if addr == "" {
		t.Fatal("no monitoring address")
	}
	resp, err := http.Get("http://" + addr + "/varz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Connections *int `json:"connections"`
		Leafnodes   *int `json:"leafnodes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || v.Connections == nil || v.Leafnodes == nil {
		t.Fatalf("/varz: %+v, %v", v, err)
	}
	if a := MonitorAddr(mustStart(t, Config{Port: -1})); a != "" {
		t.Fatalf("monitoring served unasked at %s", a)
	}
}

func mustStart(t *testing.T, c Config) *server.Server {
	t.Helper()
	s, err := Start(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}
