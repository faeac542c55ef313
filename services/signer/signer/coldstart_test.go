package signer

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats-server/v2/server"
)

// TestSignerWaitsForAColdJetStream: on a bus whose JetStream is not up yet (a
// cluster electing its meta leader), the signer keeps trying in short attempts,
// says at INFO what it waits for, and signs as soon as JetStream comes up, instead
// of exiting after one long request.
func TestSignerWaitsForAColdJetStream(t *testing.T) {
	srv, err := embedded.Start(embedded.Config{Port: -1}) // no JetStream yet
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	e := newEnvOn(t, srv)
	logs := &testkit.Buffer{}
	s := e.build(t, e.config("signer-a"), hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug}))
	done := s.run(t)
	testkit.EventuallyWithin(t, 10*time.Second, "waiting logged", func() bool {
		return strings.Contains(logs.String(), "waiting for jetstream: for=\"event stream "+events.StreamEvents+"\"")
	})
	// Keep it cold for several attempts: the signer must neither give up nor claim readiness.
	testkit.EventuallyWithin(t, 10*time.Second, "more attempts", func() bool { return strings.Contains(logs.String(), "attempt=5") })
	select {
	case err := <-done:
		done <- err
		t.Fatalf("signer exited while JetStream was cold: %v", err)
	default:
	}
	if s.ready() == nil {
		t.Fatal("ready without JetStream")
	}
	if err := srv.EnableJetStream(&server.JetStreamConfig{StoreDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testkit.Eventually(t, "signer ready after JetStream came up", func() bool { return s.ready() == nil })
	t.Logf("ready %s after JetStream came up", time.Since(start)) // how long the retry waited: a figure, not an assertion
	if !strings.Contains(logs.String(), "jetstream ready") {
		t.Errorf("no INFO line saying the wait is over:\n%s", logs)
	}
	e.js = bustest.JetStream(t, e.nc)
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	rep := natsSignAs(t, e.nc, "web-0", events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web"), Pod: events.PodRef{Namespace: "shop", Name: "web-0"}})
	if rep.Error != nil {
		t.Fatalf("sign after a cold start: %v", rep.Error)
	}
	if n := count(t, e.js, events.SubjectCertIssued); n != 1 {
		t.Fatalf("cert.issued recorded %d times", n)
	}
}
