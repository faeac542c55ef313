package embedded_test

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// serveCallout answers s's auth callout as the user kp with admit until the test ends.
func serveCallout(t *testing.T, url string, kp nkeys.KeyPair, issuer nkeys.KeyPair, admit func(req *jwt.AuthorizationRequestClaims) ([]byte, error)) {
	t.Helper()
	pub, _ := kp.PublicKey()
	nc, err := nats.Connect(url, nats.Nkey(pub, kp.Sign))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if _, err := nc.Subscribe(policy.AuthCalloutSubject, func(m *nats.Msg) {
		req, err := policy.DecodeAuthRequest(m.Data)
		if err != nil {
			t.Errorf("callout: %v", err)
			return
		}
		resp, err := admit(req)
		if err != nil {
			resp, _ = policy.Refuse(issuer, req, err.Error())
		}
		_ = m.Respond(resp)
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

type leafTier struct {
	seen    chan string // the tokens the hub's callout was shown by leaf connections
	hub     *server.Server
	creds   *policy.Credentials
	signer  *nats.Conn
	leaves  map[string]*server.Server
	tokens  map[string]*atomic.Value
	configs []embedded.Config
}

// startTier starts a secured hub that admits leaf connections presenting
// "node:<name>" as that node, and one leaf per node whose callout admits
// "pod:<ns>/<name>" as that pod.
func startTier(t *testing.T, nodes ...string) *leafTier {

	t.Helper()
	creds, err := policy.LoadOrGenerate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	hub, err := embedded.Start(embedded.Config{Name: "hub", Port: -1, LeafPort: -1, StoreDir: t.TempDir(), Auth: &creds.Keys})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hub.Shutdown)
	issuer, _ := policy.ReadSeed(creds.IssuerFile(), nkeys.PrefixByteAccount)
	calloutKP, _ := policy.ReadSeed(creds.SeedFile(policy.Callout), nkeys.PrefixByteUser)
	seen := make(chan string, 64)
	tier := &leafTier{seen: seen, leaves: map[string]*server.Server{}, tokens: map[string]*atomic.Value{}, creds: creds, hub: hub}
	serveCallout(t, hub.ClientURL(), calloutKP, issuer, func(req *jwt.AuthorizationRequestClaims) ([]byte, error) {
		select {
		case seen <- req.ConnectOptions.Token:
		default:
		}
		// "node:<name>" or "node:<name>#<generation>" (a token rotated).
		node, ok := strings.CutPrefix(req.ConnectOptions.Token, "node:")
		node, _, _ = strings.Cut(node, "#")
		if !ok || req.ClientInformation.Kind != policy.LeafClientKind {
			return nil, fmt.Errorf("not a node: kind %q jwt %q token %q user %q", req.ClientInformation.Kind, req.ConnectOptions.JWT, req.ConnectOptions.Token, req.ConnectOptions.Username)
		}
		return policy.AdmitNode(issuer, req, node, time.Now().Add(time.Hour))
	})
	signerKP, _ := policy.ReadSeed(creds.SeedFile(policy.Signer), nkeys.PrefixByteUser)
	spub, _ := signerKP.PublicKey()
	tier.signer, err = nats.Connect(hub.ClientURL(), nats.Nkey(spub, signerKP.Sign), nats.CustomInboxPrefix(policy.Inbox(policy.Signer, events.PodRef{})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tier.signer.Close)
	for _, node := range nodes {
		u, _ := url.Parse("nats://" + embedded.LeafAddr(hub))
		tok := &atomic.Value{}
		tok.Store("node:" + node)
		tier.tokens[node] = tok
		// "rogue:<node>:<ns>/<name>" plays a node agent that lies: it gives a pod
		// the permissions of another node's pod.
		admit := func(c embedded.LeafClient) (embedded.LeafUser, error) {
			asNode, tok := node, c.Token
			if rest, ok := strings.CutPrefix(tok, "rogue:"); ok {
				asNode, tok, _ = strings.Cut(rest, ":")
				tok = "pod:" + tok
			}
			s, ok := strings.CutPrefix(tok, "pod:")
			if !ok {
				return embedded.LeafUser{}, errors.New("not a pod")
			}
			pod, err := events.ParsePodRef(s)
			if err != nil {
				return embedded.LeafUser{}, err
			}
			p, err := policy.ForNodePod(asNode, pod)
			return embedded.LeafUser{Name: "pod/" + pod.String(), Permissions: p, Expires: time.Now().Add(time.Hour)}, err
		}
		cfg := embedded.Config{Name: "node-" + node, Port: -1, Leaf: &embedded.Leaf{Admit: admit, Remote: u,
			Token: func() (string, error) { return tok.Load().(string), nil }}}
		leaf, err := embedded.Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Port = leaf.Addr().(*net.TCPAddr).Port
		tier.configs = append(tier.configs, cfg)
		t.Cleanup(leaf.Shutdown)
		tier.leaves[node] = leaf
	}
	testkit.Eventually(t, "every leaf connected to the hub", func() bool { return hub.NumLeafNodes() == len(nodes) })
	return tier
}

func podConn(t *testing.T, leaf *server.Server, pod events.PodRef) *nats.Conn {
	t.Helper()
	return tokenConn(t, leaf, pod, "pod:"+pod.String())
}

func tokenConn(t *testing.T, leaf *server.Server, pod events.PodRef, token string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(leaf.ClientURL(), nats.Token(token), nats.CustomInboxPrefix(policy.Inbox(policy.Pod, pod)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestLeafTierCarriesOnlyEachNodesOwnSignSubjects: a pod on a node's leaf asks the
// hub's signer on its node sign subject and gets the answer; a request on another
// node's subject never reaches the hub, whichever pod sends it.
func TestLeafTierCarriesOnlyEachNodesOwnSignSubjects(t *testing.T) {
	tier := startTier(t, "node-a", "node-b")
	got := make(chan string, 64)
	if _, err := tier.signer.QueueSubscribe(events.SignWildcard, events.SignerQueue, func(m *nats.Msg) {
		got <- m.Subject
		_ = m.Respond([]byte("signed " + m.Subject))
	}); err != nil {
		t.Fatal(err)
	}
	if err := tier.signer.Flush(); err != nil {
		t.Fatal(err)
	}
	web := events.PodRef{Namespace: "shop", Name: "web-0"}
	nc := podConn(t, tier.leaves["node-a"], web)
	own, _ := events.NodeSignSubject("node-a", web)
	var reply *nats.Msg
	testkit.Eventually(t, "the signer answers the pod through its node", func() bool {
		m, err := nc.Request(own, []byte("csr"), 500*time.Millisecond)
		reply = m
		return err == nil
	})
	if string(reply.Data) != "signed "+own {
		t.Fatalf("reply %q", reply.Data)
	}
	// Positive control above; now the attacks, each a pod of node-a.
	other, _ := events.NodeSignSubject("node-b", web)
	hubSubject, _ := events.PodSignSubject(web)
	idSubject, _ := events.IdentitySignSubject(web, "web")
	for _, subj := range []string{other, hubSubject, idSubject, events.SubjectSignAny} {
		if _, err := nc.Request(subj, []byte("csr"), 300*time.Millisecond); err == nil {
			t.Errorf("request on %s through node-a was answered", subj)
		}
	}
	// A node agent that lies (node-a's leaf giving its pod node-b's sign subject)
	// gets nothing past the hub: node-a's connection may not publish there. The
	// same pod on node-b, admitted honestly, is the positive control.
	rogue := tokenConn(t, tier.leaves["node-a"], web, "rogue:node-b:"+web.String())
	if _, err := rogue.Request(other, []byte("csr"), 500*time.Millisecond); err == nil {
		t.Errorf("a request on node-b's subject through node-a's leaf was answered")
	}
	onB := podConn(t, tier.leaves["node-b"], web)
	testkit.Eventually(t, "the same pod through node-b is answered", func() bool {
		_, err := onB.Request(other, []byte("csr"), 500*time.Millisecond)
		return err == nil
	})
	// The signer saw the pods' own requests only.
	close(got)
	for s := range got {
		if s != own && s != other {
			t.Errorf("the hub's signer received %s", s)
		}
	}
}

// TestLeafReloadRenewsTheNodesToken: a node's new token reaches the hub when the
// leaf server reloads; the node's pods reconnect to their node and are answered
// again through the renewed hub connection.
func TestLeafReloadRenewsTheNodesToken(t *testing.T) {
	tier := startTier(t, "node-a")
	if _, err := tier.signer.QueueSubscribe(events.SignWildcard, events.SignerQueue, func(m *nats.Msg) { _ = m.Respond([]byte("ok")) }); err != nil {
		t.Fatal(err)
	}
	if err := tier.signer.Flush(); err != nil {
		t.Fatal(err)
	}
	web := events.PodRef{Namespace: "shop", Name: "web-0"}
	nc := podConn(t, tier.leaves["node-a"], web)
	subj, _ := events.NodeSignSubject("node-a", web)
	testkit.Eventually(t, "the pod is answered", func() bool { _, err := nc.Request(subj, nil, 500*time.Millisecond); return err == nil })
	tier.tokens["node-a"].Store("node:node-a#2")
	if err := embedded.Reload(tier.leaves["node-a"], tier.configs[0]); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the hub admits the node by its new token", func() bool {
		for {
			select {
			case tok := <-tier.seen:
				if tok == "node:node-a#2" {
					return true
				}
			default:
				return false
			}
		}
	})
	testkit.Eventually(t, "the pod is answered again", func() bool {
		_, err := nc.Request(subj, nil, 500*time.Millisecond)
		return err == nil && tier.hub.NumLeafNodes() == 1
	})
}
