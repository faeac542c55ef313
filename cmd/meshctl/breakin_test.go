package main

// The break-in suite (issue 8): attacks on the real stack of `meshctl up` — the
// service binaries, the secured embedded nats-server, the signer's auth callout —
// by someone holding no credential, the audit credential, or one pod's own
// service-account token. Every attack must be refused and change nothing, so each
// subtest asserts on state (the CA bucket's stream, the signer's bundle generation,
// the event stream, what the pods serve over SDS, the services' metrics), not only on
// the error. The subtests share one stack and run in order: the genuine operations
// between them (a forced renewal, two root rotations) make the full run whose bus,
// event history and JetStream store the last subtest searches for private keys.

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/obstest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// The pod under attack and the pod whose token the attacker holds (the stack's
// demo pods, in namespace default).
const (
	victim   = "demo-0"
	attacker = "demo-1"
)

// victimRef and attackerRef are those pods on the bus.
var (
	victimRef   = events.PodRef{Namespace: devstack.DemoNamespace, Name: victim}
	attackerRef = events.PodRef{Namespace: devstack.DemoNamespace, Name: attacker}
)

// rotateMin is the signer's -root-rotate-min-interval in the suite: short, so that
// the full run fits two rotations (and the bundle cap) in a test's time.
const rotateMin = 2 * time.Second

func TestBreakIn(t *testing.T) { runBreakIn(t, newBreakin(t, 0)) }

// TestBreakInThroughNodes is the same suite on a stack with a node tier (issue 35):
// the pods, the attacker's among them, reach the bus through their nodes' agents
// (NATS leaf nodes), and each attack is made through the attacker's node.
func TestBreakInThroughNodes(t *testing.T) { runBreakIn(t, newBreakin(t, 2)) }

func runBreakIn(t *testing.T, h *breakin) {
	t.Run("no credential, no connection", h.noCredential)
	t.Run("tokens the callout refuses", h.badTokens)
	t.Run("read the CA key", h.readCAKey)
	t.Run("answer sign requests", h.answerSignRequests)
	t.Run("another pod's subjects", h.otherPods)
	t.Run("lie to the rotator", h.lieToRotator)
	t.Run("foreign client certificate over grpc", h.foreignClientCert)
	t.Run("signer replies into its own state", h.replyIntoState)
	t.Run("admin widens the event stream", h.widenEventStream)
	t.Run("forge trust.changed", h.forgeTrustChanged)
	t.Run("rotate the root", h.rotateRoot)
	t.Run("grow the bundle", h.growBundle)
	t.Run("no private key byte anywhere", h.noPrivateKeyBytes)
	t.Run("attackers heard nothing", h.heardNothing)
}

// breakin is the shared stack, the attackers' connections and the observers.
type breakin struct {
	dir string
	st  *stackfile.Stack
	// meshctlLog is meshctl's own log (warnings and up): its trust-bundle writer
	// says there when it refuses a trust.changed.
	meshctlLog *testkit.Buffer
	iss        *devtoken.Issuer
	admin      *nats.Conn
	// audit and pod are the attackers: the audit credential, and demo-1's token.
	audit, pod         *nats.Conn
	auditErrs, podErrs *violations
	// signer holds the signer's bus credential, as if it had leaked: for the
	// checks the services make beyond the bus permissions.
	signer *nats.Conn
	// caStream observes the CA bucket through the signer's own credential: the stack
	// owner's second path to it (no attacker holds it).
	caStream jetstream.JetStream
	// events reads MESHAGENT_EVENTS as audit may.
	events jetstream.JetStream
	tap    *wiretap
	keys   *keyRing
	// listening are the attackers' subscriptions, open for the whole run.
	listening []*listener
	// rootsSeen are every root the signer served during the run.
	rootsSeen map[string]*x509.Certificate
}

// podNode is the node agent the attacker's pod reaches the bus through; nil on a
// stack without a node tier (the pods connect to the hub).
func (h *breakin) podNode() *stackfile.Node {
	name := h.podInfo(attacker).Node
	for i := range h.st.Nodes {
		if h.st.Nodes[i].Name == name {
			return &h.st.Nodes[i]
		}
	}
	return nil
}

// podURL is where the attacker's pod connects: its node agent, or the hub.
func (h *breakin) podURL() string {
	if n := h.podNode(); n != nil {
		return "nats://" + n.Bus
	}
	return h.st.NATSURL
}

// admission is where pods' connections are admitted and counted: the attacker's
// node agent on a node tier (its metrics and reason names), else the signer's
// callout; refused maps the callout's reason to the node's.
func (h *breakin) admission() (http, admitted string, refused func(reason string) string) {
	if n := h.podNode(); n != nil {
		byNode := map[string]string{"bad_token": "token", "no_token": "token", "not_pod_bound": "no_pod"}
		return n.HTTP, "meshagent_node_admissions_total", func(reason string) string {
			return `meshagent_node_refusals_total{reason="` + cmp.Or(byNode[reason], reason) + `"}`
		}
	}
	return h.st.Signer.HTTP, "meshagent_signer_bus_callout_admitted_total", func(reason string) string {
		return `meshagent_signer_bus_callout_refused_total{reason="` + reason + `"}`
	}
}

func newBreakin(t *testing.T, nodes int) *breakin {
	dir := testkit.ShortDir(t)
	tap := &wiretap{}
	r, logs := startStackLogged(t, devstack.Config{Dir: dir, Pods: 2, Nodes: nodes, LeafTTL: time.Hour, RootRotateMinInterval: rotateMin, OnEvent: tap.record})
	h := &breakin{dir: dir, st: &r.Stack, meshctlLog: logs, admin: r.Conn(), tap: tap, keys: &keyRing{}, rootsSeen: map[string]*x509.Certificate{}}
	var err error
	if h.iss, err = devtoken.Load(dir + "/issuer"); err != nil {
		t.Fatal(err)
	}
	h.auditErrs, h.podErrs = &violations{}, &violations{}
	h.audit = h.connRole(t, h.st.NATSAuditNKey, policy.Audit, h.auditErrs)
	tok, err := os.ReadFile(h.podInfo(attacker).TokenFile)
	if err != nil {
		t.Fatal(err)
	}
	if h.pod, err = h.connToken(t, string(tok), attackerRef, h.podErrs); err != nil {
		t.Fatalf("the attacker pod's own token: %v", err)
	}
	h.signer = h.connRole(t, dir+"/secrets/"+string(policy.Signer)+".nk", policy.Signer, nil)
	h.caStream = h.jsOf(t, h.signer)
	h.events = h.jsOf(t, h.audit)
	// The attackers listen to everything they may try to, from the start to the end.
	for _, who := range []struct {
		name string
		nc   *nats.Conn
	}{{"audit", h.audit}, {"pod " + attacker, h.pod}} {
		for _, subj := range []string{">", "$KV.>", "$KV." + policy.BucketCA + ".>", "$JS.>", "_INBOX.>",
			events.SignWildcard, "meshagent.rpc.>", "meshagent.pod.>", "meshagent.pod.*." + victim + ".>", "meshagent.pod.default." + victim + ".>",
			policy.Inbox(policy.Pod, victimRef) + ".>", policy.Inbox(policy.Signer, events.PodRef{}) + ".>", policy.Inbox(policy.Admin, events.PodRef{}) + ".>"} {
			h.listening = append(h.listening, listen(t, who.name, who.nc, subj, ""))
		}
		h.listening = append(h.listening, listen(t, who.name, who.nc, events.SignWildcard, events.SignerQueue))
	}
	flush(t, h.audit, h.pod)
	// The pods' first keys.
	for _, p := range h.st.Pods {
		h.serving(t, p.ID)
	}
	return h
}

func (h *breakin) podInfo(id string) stackfile.Pod {
	for _, p := range h.st.Pods {
		if p.ID == id {
			return p
		}
	}
	panic("no pod " + id)
}

// connRole connects with an nkey seed as role r (its inbox prefix).
func (h *breakin) connRole(t *testing.T, seedFile string, r policy.Role, v *violations) *nats.Conn {
	t.Helper()
	kp, err := policy.ReadSeed(seedFile, nkeys.PrefixByteUser)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(h.st.NATSURL, nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(policy.Inbox(r, events.PodRef{})),
		nats.Name("breakin/"+string(r)), nats.ErrorHandler(v.handler), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("connect as %s: %v", r, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// connToken connects with token as the connect token, the way a pod does, with
// pod's inbox.
func (h *breakin) connToken(t *testing.T, token string, pod events.PodRef, v *violations) (*nats.Conn, error) {
	t.Helper()
	nc, err := nats.Connect(h.podURL(), nats.Token(token), nats.CustomInboxPrefix(policy.Inbox(policy.Pod, pod)),
		nats.Name("breakin/pod"), nats.ErrorHandler(v.handler), nats.MaxReconnects(0), nats.Timeout(5*time.Second))
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

func (h *breakin) jsOf(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// violations collects the permission violations a server reports to a client.
type violations struct {
	mu   sync.Mutex
	errs []error
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	if v == nil {
		return
	}
	v.mu.Lock()
	v.errs = append(v.errs, err)
	v.mu.Unlock()
}

// saw reports whether the server refused subject to this client.
func (v *violations) saw(subject string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, e := range v.errs {
		if errors.Is(e, nats.ErrPermissionViolation) && strings.Contains(e.Error(), `"`+subject+`"`) {
			return true
		}
	}
	return false
}

// requireViolations waits until the server has refused every subject to v's client.
func requireViolations(t *testing.T, who string, v *violations, subjects ...string) {
	t.Helper()
	for _, s := range subjects {
		testkit.EventuallyWithin(t, 30*time.Second, fmt.Sprintf("%s: no permission violation for %s", who, s), func() bool { return v.saw(s) })
	}
}

// listener is an attacker's subscription that must never receive anything.
type listener struct {
	who, subject, queue string
	got                 atomic.Int64
	first               atomic.Value // subject of the first message
}

func listen(t *testing.T, who string, nc *nats.Conn, subject, queue string) *listener {
	t.Helper()
	l := &listener{who: who, subject: subject, queue: queue}
	h := func(m *nats.Msg) {
		if l.got.Add(1) == 1 {
			l.first.Store(m.Subject)
		}
	}
	var err error
	if queue == "" {
		_, err = nc.Subscribe(subject, h)
	} else {
		_, err = nc.QueueSubscribe(subject, queue, h)
	}
	if err != nil {
		t.Fatalf("%s subscribe %s: %v", who, subject, err)
	}
	return l
}

func flush(t *testing.T, ncs ...*nats.Conn) {
	t.Helper()
	for _, nc := range ncs {
		if err := nc.FlushTimeout(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// wiretap keeps every event an admin subscription to meshagent.evt.> received
// since the bus came up.
type wiretap struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

func (w *wiretap) record(m *nats.Msg) {
	c := &nats.Msg{Subject: m.Subject, Header: m.Header, Data: append([]byte(nil), m.Data...)}
	w.mu.Lock()
	w.msgs = append(w.msgs, c)
	w.mu.Unlock()
}

func (w *wiretap) all() []*nats.Msg {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*nats.Msg(nil), w.msgs...)
}

// renewsSent counts the rotator's renew_sent records for pod with reason.
func (w *wiretap) renewsSent(pod events.PodRef, reason string) int {
	n := 0
	for _, m := range w.all() {
		if m.Subject != events.SubjectRenewSent {
			continue
		}
		if ev, _, err := events.Decode[events.RenewDue](m); err == nil && ev.Pod == pod && ev.Reason == reason {
			n++
		}
	}
	return n
}

// ---- observers of state ----

// caState is the CA bucket's stream position: any write moves it.
func (h *breakin) caState(t *testing.T) uint64 {
	t.Helper()
	s, err := h.caStream.Stream(ctxT(t, 5*time.Second), "KV_"+policy.BucketCA)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// stored counts the messages the event streams hold on subject (a wildcard sums):
// MESHAGENT_EVENTS for the CA's, MESHAGENT_POD_EVENTS for a pod's.
func (h *breakin) stored(t *testing.T, subject string) uint64 {
	t.Helper()
	s, err := h.events.Stream(ctxT(t, 5*time.Second), cmp.Or(events.StreamOf(subject), events.StreamEvents))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctxT(t, 5*time.Second), jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

// bundle is the signer's trust bundle, asked for as the operator.
func (h *breakin) bundle(t *testing.T) events.BundleReply {
	t.Helper()
	req, err := events.NewMsg(events.SubjectTrustBundle, "breakin", events.BundleRequest{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := h.admin.RequestMsgWithContext(ctxT(t, 10*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := events.Decode[events.BundleReply](resp)
	if err != nil || b.Error != nil {
		t.Fatalf("bundle: %v %v", err, b.Error)
	}
	for _, r := range b.Roots {
		c, err := pki.ParseCertsPEM([]byte(r))
		if err != nil {
			t.Fatal(err)
		}
		h.rootsSeen[pki.Fingerprint(c[0])] = c[0]
	}
	return b
}

// served is what one pod serves over SDS now.
type served struct {
	serial string
	root   string // fingerprint of the ROOTCA root whose key signed the leaf (else the chain's last)
	rootCA []string
}

// serving fetches a pod's default and ROOTCA over SDS and remembers its key.
func (h *breakin) serving(t *testing.T, pod string) served {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	cc, err := sdsclient.DialUnix(ctx, h.podInfo(pod).SDSSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	s, err := sdsclient.Fetch(ctx, cc, "sidecar~breakin", "default", "ROOTCA")
	if err != nil {
		t.Fatal(err)
	}
	h.keys.add(t, s["default"].PrivateKey)
	chain, err := pki.ParseCertsPEM(s["default"].CertChain)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := pki.ParseCertsPEM(s["ROOTCA"].TrustedCA)
	if err != nil {
		t.Fatal(err)
	}
	out := served{serial: pki.SerialHex(chain[0]), root: pki.Fingerprint(chain[len(chain)-1])}
	signed := false
	for _, r := range roots { // newest first
		out.rootCA = append(out.rootCA, pki.Fingerprint(r))
		// During a rotation to a new key the chain ends at the old root (the cross-signed
		// phases): the leaf is under the root whose key signed it.
		if !signed && chain[0].CheckSignatureFrom(r) == nil {
			out.root, signed = pki.Fingerprint(r), true
		}
	}
	return out
}

// metric reads one series from a service's /metrics; absent is 0.
func metric(t *testing.T, addr, series string) float64 {
	t.Helper()
	return obstest.Scraped(t, addr, series)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// request sends p on subject from nc and decodes the reply as R.
func request[R events.Payload](t *testing.T, nc *nats.Conn, subject string, p events.Payload) (R, error) {
	t.Helper()
	var zero R
	msg, err := events.NewMsgOn(subject, "breakin", p)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := nc.RequestMsgWithContext(ctxT(t, 3*time.Second), msg)
	if err != nil {
		return zero, err
	}
	r, err := events.DecodeReply[R](resp)
	if err != nil {
		return zero, fmt.Errorf("reply: %w", err)
	}
	return r, nil
}

func publish(t *testing.T, nc *nats.Conn, subject string, p events.Payload) {
	t.Helper()
	msg, err := events.NewMsgOn(subject, "breakin", p)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
}
