package bus

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus/bustest"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
)

func TestConfigFromEnvAndValidate(t *testing.T) {
	fs := flagenv.New("t", func(k string) string { return map[string]string{"NATS_URL": "nats://a:4222", "NATS_TLS_CERT": "c.pem"}[k] })
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
	nc, err := Connect(ctx, Config{URL: s.ClientURL(), Name: "test"}, hclog.NewNullLogger(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js := bustest.JetStream(t, nc)
	st, err := EnsureEventStream(ctx, js, 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := events.NewMsg("meshagent.evt.pod.p1.down", "test", events.PodDown{Pod: "p1"})
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
	_, err := Connect(ctx, Config{URL: "nats://127.0.0.1:1"}, hclog.NewNullLogger(), 100*time.Millisecond)
	if err == nil {
		t.Fatal("connected to nothing")
	}
}
