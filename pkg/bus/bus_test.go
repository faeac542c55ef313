package bus

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

func TestConfigFromEnvAndValidate(t *testing.T) {
	fs := flagenv.New("t", func(k string) string {
		return map[string]string{"NATS_URL": "nats://a:4222", "NATS_TLS_CERT": "c.pem"}[k]
	})
	var c Config
	c.Bind(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if c.URL != "nats://a:4222" {
		t.Fatalf("url = %q", c.URL)
	}
	if err := c.Validate(); err == nil {
		t.Fatal("cert without key accepted")
	}
	c.URL = " "
	c.TLS = TLSConfig{}
	if err := c.Validate(); err == nil {
		t.Fatal("empty url accepted")
	}
}

func TestConnectAndPublishToStream(t *testing.T) {
	s := bustest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := Connect(ctx, Config{URL: s.ClientURL(), Name: "test", ConnectWait: time.Second}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js := bustest.JetStream(t, nc)
	if _, err := EnsureEventStream(ctx, js, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	// A pod's event: kept in the pods' stream.
	st, err := js.Stream(ctx, events.StreamPodEvents)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := events.NewMsg("meshagent.evt.pod.default.p1.down", "test", events.PodDown{Pod: ref("p1")})
	if err != nil {
		t.Fatal(err)
	}
	// Publishing the same event twice stores it once (dedup by event id).
	for range 2 {
		if err := Publish(ctx, js, msg); err != nil {
			t.Fatal(err)
		}
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages, want 1", info.State.Msgs)
	}
}

func TestConnectGivesUpWithClearError(t *testing.T) {
	ctx := context.Background()
	_, err := Connect(ctx, Config{URL: "nats://127.0.0.1:1", ConnectWait: 100 * time.Millisecond}, hclog.NewNullLogger())
	if err == nil {
		t.Fatal("connected to nothing")
	}
}

func TestConnectWithRoleCredential(t *testing.T) {
	s := bustest.SecureServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := Config{URL: s.Server.ClientURL(), NKeyFile: s.Creds.SeedFile(policy.Signer), InboxPrefix: policy.Inbox(policy.Signer, events.PodRef{}), ConnectWait: time.Second}
	nc, err := Connect(ctx, cfg, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Its inbox is the role's: a JetStream request (which replies to it) works.
	if _, err := EnsureEventStream(ctx, bustest.JetStream(t, nc), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	cfg.NKeyFile = filepath.Join(t.TempDir(), "missing.nk")
	if _, err := Connect(ctx, cfg, hclog.NewNullLogger()); err == nil || !strings.Contains(err.Error(), "-nats-nkey") {
		t.Fatalf("missing seed: %v", err)
	}
	cfg.NKeyFile = ""
	cfg.ConnectWait = 200 * time.Millisecond
	if _, err := Connect(ctx, cfg, hclog.NewNullLogger()); err == nil {
		t.Fatal("connected to a secured bus without a credential")
	}
}

func TestValidateOneCredential(t *testing.T) {
	c := Config{URL: DefaultURL, NKeyFile: "a.nk", TokenFile: "token"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "at most one") {
		t.Fatalf("two credentials: %v", err)
	}
}

// TestConnectInBackground: with Background, Connect returns at once although no
// server is up, a subscription made meanwhile works once one is, and the reconnect
// handler tells the caller it has connected.
func TestConnectInBackground(t *testing.T) {
	probe := bustest.Server(t)
	port := probe.Addr().(*net.TCPAddr).Port
	probe.Shutdown()
	probe.WaitForShutdown()
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)

	nc, err := Connect(context.Background(), Config{URL: url, Background: true, ConnectWait: time.Hour}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if nc.IsConnected() {
		t.Fatal("connected with no server up")
	}
	var connected atomic.Bool
	prev := nc.ReconnectHandler()
	nc.SetReconnectHandler(func(c *nats.Conn) { prev(c); connected.Store(true) })
	got := make(chan string, 1)
	if _, err := nc.Subscribe("hello", func(m *nats.Msg) { got <- string(m.Data) }); err != nil {
		t.Fatal(err)
	}

	s, err := embedded.Start(embedded.Config{Port: port, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	testkit.Eventually(t, "the background connection", func() bool { return nc.IsConnected() && connected.Load() })
	other := bustest.Conn(t, s)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := other.Publish("hello", []byte("world")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m != "world" {
			t.Fatalf("got %q", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("subscription made before connecting got nothing")
	}
}

// TestEventStreamRetention: the audit log keeps 7 days / 1 GiB unless told, and a
// size bound an operator set on the stream survives the signer's next start.
func TestEventStreamRetention(t *testing.T) {
	s := bustest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js := bustest.JetStream(t, bustest.Conn(t, s))
	st, err := EnsureEventStreamRetention(ctx, js, 1, Retention{})
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; c.MaxAge != 7*24*time.Hour || c.MaxBytes != 1<<30 {
		t.Fatalf("default retention %s / %d bytes, want 168h / 1 GiB", c.MaxAge, c.MaxBytes)
	}
	if _, err := EnsureEventStreamRetention(ctx, js, 1, Retention{MaxAge: time.Hour, MaxBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	st, err = EnsureEventStream(ctx, js, 1, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; c.MaxAge != 48*time.Hour || c.MaxBytes != 64<<20 {
		t.Fatalf("retention %s / %d bytes, want 48h / the 64 MiB already set", c.MaxAge, c.MaxBytes)
	}
}
