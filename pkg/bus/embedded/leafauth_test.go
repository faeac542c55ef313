package embedded_test

import (
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// TestLeafAdmitsInsideTheServer: a leaf server admits each client by its Admit,
// with the user's permissions enforced by nats-server and its connection ended
// at the user's expiry; a client Admit refuses never connects.
func TestLeafAdmitsInsideTheServer(t *testing.T) {
	tier := startTier(t, "node-a")
	web := events.PodRef{Namespace: "shop", Name: "web-0"}
	perms, err := policy.ForNodePod("node-a", web)
	if err != nil {
		t.Fatal(err)
	}
	life := map[string]time.Duration{"long": time.Hour, "short": 1500 * time.Millisecond}
	admit := func(c embedded.LeafClient) (embedded.LeafUser, error) {
		d, ok := life[c.Token]
		if !ok {
			return embedded.LeafUser{}, errors.New("unknown token")
		}
		return embedded.LeafUser{Name: "pod/" + web.String(), Permissions: perms, Expires: time.Now().Add(d)}, nil
	}
	u, _ := url.Parse("nats://" + embedded.LeafAddr(tier.hub))
	leaf, err := embedded.Start(embedded.Config{Name: "node-a-2", Port: -1, Leaf: &embedded.Leaf{Admit: admit, Remote: u,
		Token: func() (string, error) { return "node:node-a", nil }}})
	if err != nil {
		t.Fatal(err)
	}
	defer leaf.Shutdown()

	if nc, err := nats.Connect(leaf.ClientURL(), nats.Token("forged"), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client Admit refused connected")
	}
	// A user's permissions hold: its own sign subject, not another pod's.
	long, err := nats.Connect(leaf.ClientURL(), nats.Token("long"), nats.CustomInboxPrefix(policy.Inbox(policy.Pod, web)))
	if err != nil {
		t.Fatalf("an admitted client: %v", err)
	}
	defer long.Close()
	denied := make(chan error, 4)
	long.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { denied <- err })
	other, _ := events.NodeSignSubject("node-a", events.PodRef{Namespace: "shop", Name: "web-1"})
	own, _ := events.NodeSignSubject("node-a", web)
	if err := long.Publish(own, nil); err != nil {
		t.Fatal(err)
	}
	if err := long.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-denied:
		t.Fatalf("publishing on its own sign subject: %v", err)
	default:
	}
	if err := long.Publish(other, nil); err != nil {
		t.Fatal(err)
	}
	_ = long.Flush()
	testkit.Eventually(t, "the server refused a publish on another pod's subject", func() bool {
		select {
		case err := <-denied:
			return errors.Is(err, nats.ErrPermissionViolation)
		default:
			return false
		}
	})
	// The user's expiry ends its connection; the long-lived one stays.
	short, err := nats.Connect(leaf.ClientURL(), nats.Token("short"), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("an admitted client: %v", err)
	}
	defer short.Close()
	testkit.Eventually(t, "the server ended the expired user's connection", func() bool { return short.IsClosed() })
	if !long.IsConnected() {
		t.Error("the long-lived user's connection ended too")
	}
}
