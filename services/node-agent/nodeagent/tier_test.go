package nodeagent_test

// The node tier end to end: a secured hub (embedded nats-server with its leaf
// listener), the real signer binary answering its auth callout and signing, two
// node agents, and pods with real pod- and node-bound tokens. Every attack has a
// positive control beside it: the same request, made honestly, is signed.

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/node-agent/nodeagent"
	"github.com/meshagent/meshagent/tests/devtokentest"
	"github.com/meshagent/meshagent/tests/obstest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// The node agents' service account, as deploy/kubernetes names it.
const agentNS, agentSA = "meshagent-system", "meshagent-node"

type tier struct {
	hub    *server.Server
	iss    *devtoken.Issuer
	jwks   string
	signer *testkit.Service
	agents map[string]*nodeagent.Agent
}

func startTier(t *testing.T, nodes ...string) *tier {
	t.Helper()
	dir := testkit.ShortDir(t)
	creds, err := policy.LoadOrGenerate(filepath.Join(dir, "creds"))
	if err != nil {
		t.Fatal(err)
	}
	hub, err := embedded.Start(embedded.Config{Name: "hub", Port: -1, LeafPort: -1, StoreDir: filepath.Join(dir, "js"), Auth: &creds.Keys})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hub.Shutdown(); hub.WaitForShutdown() })
	iss, signer := devtokentest.StartSigner(t, hub.ClientURL(), "-nats-nkey", creds.SeedFile(policy.Signer),
		"-bus-callout-seed", creds.IssuerFile(), "-bus-callout-nkey", creds.SeedFile(policy.Callout),
		"-node-agent-accounts", agentNS+"/"+agentSA)
	tr := &tier{hub: hub, iss: iss, signer: signer, agents: map[string]*nodeagent.Agent{}, jwks: filepath.Join(dir, "jwks.json")}
	b, err := json.Marshal(iss.KeySet())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tr.jwks, b, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, node := range nodes {
		tr.agents[node] = tr.startAgent(t, node, tr.agentToken(t, node, node))
	}
	for node, a := range tr.agents {
		waitReady(t, node, a)
	}
	testkit.Eventually(t, "every node connected to the hub", func() bool { return hub.NumLeafNodes() == len(nodes) })
	return tr
}

// agentToken is a node agent's token: its own pod, bound to node.
func (tr *tier) agentToken(t *testing.T, pod, node string) string {
	t.Helper()
	tok, err := tr.iss.MintForPodOnNode(agentNS, agentSA, "node-agent-"+pod, node, devtoken.DefaultAudience, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (tr *tier) startAgent(t *testing.T, node, token string) *nodeagent.Agent {
	t.Helper()
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := nodeagent.Load([]string{"-node", node, "-hub", "nats://" + embedded.LeafAddr(tr.hub), "-token-file", tokFile,
		"-listen", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-jwks-file", tr.jwks, "-token-issuer", tr.iss.Name}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	a, err := nodeagent.New(cfg, lifecycle.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Background(t, a.Run)
	testkit.Eventually(t, "node agent "+node+" serving", func() bool { return a.Addr() != "" })
	return a
}

func waitReady(t *testing.T, node string, a *nodeagent.Agent) {
	t.Helper()
	if !testkit.Poll(15*time.Second, func() bool { return a.Ready() == nil }) {
		t.Fatalf("node agent %s not ready: %v", node, a.Ready())
	}
}

// podToken is pod's projected token, bound to pod and to node.
func (tr *tier) podToken(t *testing.T, pod events.PodRef, sa, node string) string {
	t.Helper()
	tok, err := tr.iss.MintForPodOnNode(pod.Namespace, sa, pod.Name, node, devtoken.DefaultAudience, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// connect connects as pod with token to the bus at addr.
func connect(addr string, pod events.PodRef, token string) (*nats.Conn, error) {
	return nats.Connect("nats://"+addr, nats.Token(token), nats.CustomInboxPrefix(policy.Inbox(policy.Pod, pod)),
		nats.Timeout(5*time.Second), nats.MaxReconnects(0))
}

// sign asks for pod's certificate on subject with token in the request, and
// returns the SPIFFE ID it was signed for.
func sign(t *testing.T, nc *nats.Conn, subject string, pod events.PodRef, token string) (string, error) {
	t.Helper()
	return signWithin(t, 10*time.Second, nc, subject, pod, token)
}

// signWithin is sign waiting at most d: for a request that must go unanswered.
func signWithin(t *testing.T, d time.Duration, nc *nats.Conn, subject string, pod events.PodRef, token string) (string, error) {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, "spiffe://cluster.local/ns/"+pod.Namespace+"/sa/x")
	if err != nil {
		t.Fatal(err)
	}
	req := events.SignRequest{CSR: string(csr), Token: token, Pod: pod, TTL: time.Hour}
	msg, err := events.NewSignRequestMsg(subject, events.EncodingCompact, "test", req)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	resp, err := nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return "", err
	}
	rep, _, err := events.DecodeSignReply(resp)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Error != nil {
		return "", rep.Error
	}
	certs, err := pki.ParseCertPEMs(rep.CertChain[:1])
	if err != nil {
		t.Fatal(err)
	}
	leaf := certs[0]
	if len(leaf.URIs) != 1 {
		t.Fatalf("leaf URIs %v", leaf.URIs)
	}
	return leaf.URIs[0].String(), nil
}

func nodeSubject(t *testing.T, node string, pod events.PodRef) string {
	t.Helper()
	s, err := events.NodeSignSubject(node, pod)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNodeTier(t *testing.T) {
	tr := startTier(t, "node-a", "node-b")
	web := events.PodRef{Namespace: "shop", Name: "web-0"}
	webTok := tr.podToken(t, web, "web", "node-a")
	clientsBefore := tr.hub.NumClients()

	// The pod, on its own node: certified, as its own identity.
	nc, err := connect(tr.agents["node-a"].Addr(), web, webTok)
	if err != nil {
		t.Fatalf("the pod on its own node: %v", err)
	}
	defer nc.Close()
	id, err := sign(t, nc, nodeSubject(t, "node-a", web), web, webTok)
	if err != nil || id != "spiffe://cluster.local/ns/shop/sa/web" {
		t.Fatalf("the pod's own certificate: %q, %v", id, err)
	}
	if n := tr.hub.NumClients(); n != clientsBefore {
		t.Errorf("the hub holds %d client connections, %d before the pod: a pod reached it directly", n, clientsBefore)
	}

	t.Run("a pod's token through another node is refused at the node", func(t *testing.T) {
		if nc, err := connect(tr.agents["node-b"].Addr(), web, webTok); err == nil {
			nc.Close()
			t.Fatal("node-b admitted a pod whose token binds it to node-a")
		}
	})

	t.Run("a node that lies gets nothing for a pod of another node", func(t *testing.T) {
		rogue := startLyingLeaf(t, tr, "node-b")
		// With web-0's real token (bound to node-a), through node-b's own subject:
		// the bus carries it, the signer refuses it.
		nc := rogue.conn(t, web, webTok)
		if _, err := sign(t, nc, nodeSubject(t, "node-b", web), web, webTok); err == nil || !strings.Contains(err.Error(), `binds it to node "node-a"`) {
			t.Errorf("signed through node-b with node-a's pod's token: %v", err)
		}
		// Through node-a's subject (the lying leaf lets its client publish there):
		// node-b's leaf connection may not, so the hub never carries it.
		asA := rogue.connAs(t, web, "node-a", webTok)
		if _, err := signWithin(t, 2*time.Second, asA, nodeSubject(t, "node-a", web), web, webTok); err == nil {
			t.Error("node-b's connection sent a request on node-a's subject that was answered")
		}
		// Positive control: a pod of node-b, through the same leaf, is signed.
		onB := events.PodRef{Namespace: "shop", Name: "web-1"}
		tokB := tr.podToken(t, onB, "web", "node-b")
		if id, err := sign(t, rogue.conn(t, onB, tokB), nodeSubject(t, "node-b", onB), onB, tokB); err != nil || id != "spiffe://cluster.local/ns/shop/sa/web" {
			t.Errorf("node-b's own pod through the same leaf: %q, %v", id, err)
		}
	})

	t.Run("same name in two namespaces: two pods", func(t *testing.T) {
		evil := events.PodRef{Namespace: "attacker", Name: "web-0"}
		evilTok := tr.podToken(t, evil, "web", "node-a")
		enc, err := connect(tr.agents["node-a"].Addr(), evil, evilTok)
		if err != nil {
			t.Fatal(err)
		}
		defer enc.Close()
		// Its own certificate: the attacker namespace's identity.
		if id, err := sign(t, enc, nodeSubject(t, "node-a", evil), evil, evilTok); err != nil || id != "spiffe://cluster.local/ns/attacker/sa/web" {
			t.Fatalf("the namesake's own certificate: %q, %v", id, err)
		}
		// shop/web-0's subject: not its to publish on (the node's callout gave it
		// attacker/web-0's only), even with its own token in the request.
		if _, err := signWithin(t, 2*time.Second, enc, nodeSubject(t, "node-a", web), web, evilTok); err == nil {
			t.Error("attacker/web-0 was signed on shop/web-0's subject")
		}
		// And shop/web-0's replies never reach it.
		sub, err := enc.SubscribeSync(policy.Inbox(policy.Pod, web) + ".>")
		if err == nil {
			_ = enc.Flush()
			if _, err := sign(t, nc, nodeSubject(t, "node-a", web), web, webTok); err != nil {
				t.Fatal(err)
			}
			if m, err := sub.NextMsg(500 * time.Millisecond); err == nil {
				t.Errorf("attacker/web-0 read shop/web-0's reply on %s", m.Subject)
			}
		}
	})

	t.Run("a leaf connection that is no node agent's is refused", func(t *testing.T) {
		// A pod's own token (not a node agent's) as a node's credential.
		before := tr.hub.NumLeafNodes()
		tr.startAgent(t, "node-c", tr.podToken(t, web, "web", "node-c"))
		testkit.Eventually(t, "the signer refused the leaf connection as no node agent's", func() bool {
			return obstest.Scraped(t, tr.signer.HTTPAddr, `meshagent_signer_bus_callout_refused_total{reason="not_a_node_agent"}`) >= 1
		})
		if n := tr.hub.NumLeafNodes(); n != before {
			t.Fatalf("the hub holds %d leaf connections, %d before: it admitted a pod's token as a node", n, before)
		}
	})
}

// lyingLeaf is a node's leaf server admitted to the hub with that node's real
// agent token, which admits whatever it is told: a node agent an attacker
// controls.
type lyingLeaf struct {
	srv  *server.Server
	node string
}

func startLyingLeaf(t *testing.T, tr *tier, node string) *lyingLeaf {
	t.Helper()
	hubURL, _ := url.Parse("nats://" + embedded.LeafAddr(tr.hub))
	tok := tr.agentToken(t, "rogue", node)
	// It admits any connection as the pod its "pod:<ns>/<name>[@<node>]" user name
	// says, on that node's subjects (its own by default), without checking the
	// token at all.
	lie := func(c embedded.LeafClient) (embedded.LeafUser, error) {
		name, asNode, found := strings.Cut(strings.TrimPrefix(c.User, "pod:"), "@")
		if !found {
			asNode = node
		}
		pod, err := events.ParsePodRef(name)
		if err != nil {
			return embedded.LeafUser{}, err
		}
		p, err := policy.ForNodePod(asNode, pod)
		return embedded.LeafUser{Name: "pod/" + pod.String(), Permissions: p, Expires: time.Now().Add(time.Hour)}, err
	}
	srv, err := embedded.Start(embedded.Config{Name: "rogue-" + node, Port: -1, Leaf: &embedded.Leaf{Admit: lie,
		Remote: hubURL, Token: func() (string, error) { return tok, nil }}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	testkit.Eventually(t, "the lying leaf connected to the hub", func() bool { return srv.NumLeafNodes() == 1 })
	return &lyingLeaf{srv: srv, node: node}
}

// conn connects to the lying leaf as pod (it believes the user name).
func (l *lyingLeaf) conn(t *testing.T, pod events.PodRef, token string) *nats.Conn {
	t.Helper()
	return l.connAs(t, pod, l.node, token)
}

// connAs connects to the lying leaf as pod with node's permissions.
func (l *lyingLeaf) connAs(t *testing.T, pod events.PodRef, node, token string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(l.srv.ClientURL(), nats.UserInfo("pod:"+pod.String()+"@"+node, token), nats.CustomInboxPrefix(policy.Inbox(policy.Pod, pod)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
