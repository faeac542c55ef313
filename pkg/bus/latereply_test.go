package bus

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestLateReplyIsNotAnError: a signer resuming from a freeze answers requests whose
// response window (allow_responses) closed meanwhile, and the server refuses each
// with "Permissions Violation for Publish to _INBOX…". That is expected: counted
// and logged at info, not at error. Any other violation (here a publish the role
// may not make, the positive control) is still an error.
func TestLateReplyIsNotAnError(t *testing.T) {
	s := bustest.SecureServer(t)
	logs := &testkit.Buffer{}
	log := hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := Config{URL: s.Server.ClientURL(), Name: "signer", NKeyFile: s.Creds.SeedFile(policy.Signer), ConnectWait: time.Second}
	cfg.AsService(policy.Signer)
	signer, err := Connect(ctx, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer signer.Close()
	sub, err := signer.QueueSubscribeSync(events.SubjectTrustBundle, events.SignerQueue)
	if err != nil {
		t.Fatal(err)
	}
	if err := signer.Flush(); err != nil {
		t.Fatal(err)
	}
	rotator := s.Conn(t, policy.Rotator, nil)
	inbox := rotator.NewInbox()
	if err := rotator.PublishRequest(events.SubjectTrustBundle, inbox, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	req, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	before := LateReplies()
	// The first reply is the one allowed; the second is refused as a late one is.
	for range 2 {
		if err := signer.Publish(req.Reply, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	if err := signer.Publish("meshagent.pod.default.x.renew", nil); err != nil {
		t.Fatal(err)
	}
	_ = signer.Flush()
	testkit.Eventually(t, "both violations reported", func() bool {
		return LateReplies() > before && strings.Contains(logs.String(), "meshagent.pod.default.x.renew")
	})
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "[ERROR]") && strings.Contains(line, "_INBOX.") {
			t.Fatalf("a late reply logged as an error: %s", line)
		}
	}
	if !strings.Contains(logs.String(), "late reply dropped") {
		t.Fatalf("late reply not logged:\n%s", logs)
	}
	if !strings.Contains(logs.String(), "[ERROR] nats async error") {
		t.Fatalf("another violation was not an error:\n%s", logs)
	}
}
