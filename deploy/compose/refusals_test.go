//go:build compose

package compose

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// asyncErrs collects a connection's asynchronous errors (permission violations).
type asyncErrs chan error

func (a asyncErrs) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	select {
	case a <- err:
	default:
	}
}

// want waits for an asynchronous error containing all of parts.
func (a asyncErrs) want(t *testing.T, parts ...string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case err := <-a:
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(err.Error(), p)
			}
			if ok {
				return
			}
		case <-timeout:
			t.Fatalf("no asynchronous error with %q", parts)
		}
	}
}

// checkRefusals: what a client without a credential, with a plaintext connection or
// with the audit credential must not do, it cannot do, and nothing changes.
func checkRefusals(t *testing.T, st *stack, admin *nats.Conn) {
	nats1 := "tls://" + st.client["nats-1"]
	if nc, err := st.connect(t, nats1, "", "", 0); err == nil {
		nc.Close()
		t.Error("a client without a credential was admitted")
	} else {
		t.Logf("no credential: %v", err)
	}
	if nc, err := st.connect(t, nats1, "", "", 0, nats.Token("not-a-service-account-token")); err == nil {
		nc.Close()
		t.Error("a client with a garbage token was admitted")
	} else {
		t.Logf("garbage token: %v", err)
	}
	checkPlaintextRefused(t, st)

	errs := asyncErrs(make(chan error, 16))
	audit, err := st.connect(t, nats1, "audit.nk", "_INBOX.audit", 10*time.Second, nats.ErrorHandler(errs.handler))
	if err != nil {
		t.Fatalf("audit cannot connect: %v", err)
	}
	defer audit.Close()

	// The CA's state: not even readable.
	sub, err := audit.SubscribeSync("$KV.meshagent-ca.>")
	if err != nil {
		t.Fatal(err)
	}
	_ = audit.Flush()
	errs.want(t, "Permissions Violation", "Subscription", "$KV.meshagent-ca.>")
	if m, err := sub.NextMsg(time.Second); err == nil {
		t.Fatalf("audit read CA state on %s", m.Subject)
	}
	js, err := jetstream.New(audit)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := js.KeyValue(ctx, "meshagent-ca"); err == nil {
		t.Fatal("audit opened the CA bucket")
	}

	// A forged trust change: refused by the server, seen by nobody, bundle unchanged.
	before := bundle(t, admin)
	seen := make(chan *nats.Msg, 4)
	tc, err := admin.ChanSubscribe(events.SubjectTrustChanged, seen)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tc.Unsubscribe() }()
	if err := admin.Flush(); err != nil {
		t.Fatal(err)
	}
	forged, err := events.NewMsg(events.SubjectTrustChanged, "audit", events.TrustChanged{
		TrustDomain: "cluster.local", Roots: []string{forgedRoot(t)}, Reason: "forged", Generation: before.Generation + 100})
	if err != nil {
		t.Fatal(err)
	}
	if err := audit.PublishMsg(forged); err != nil {
		t.Fatal(err)
	}
	_ = audit.Flush()
	errs.want(t, "Permissions Violation", "Publish", events.SubjectTrustChanged)
	if err := admin.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-seen:
		t.Fatalf("a trust.changed reached the bus: %s", m.Data)
	case <-time.After(time.Second):
	}
	after := bundle(t, admin)
	if after.Generation != before.Generation || !slices.Equal(after.Roots, before.Roots) {
		t.Fatalf("trust bundle changed: generation %d -> %d", before.Generation, after.Generation)
	}
}

// forgedRoot is an attacker's self-signed root, PEM.
func forgedRoot(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "forged root"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// checkPlaintextRefused speaks the NATS protocol in the clear to nats-1: the server
// must demand TLS and never answer the PING.
func checkPlaintextRefused(t *testing.T, st *stack) {
	conn, err := net.DialTimeout("tcp", st.client["nats-1"], 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	info, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(info, "INFO ") {
		t.Fatalf("no INFO: %q %v", info, err)
	}
	var srv struct {
		TLSRequired bool `json:"tls_required"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(info, "INFO ")), &srv); err != nil || !srv.TLSRequired {
		t.Fatalf("INFO does not require TLS: %s", info)
	}
	if _, err := fmt.Fprintf(conn, "CONNECT {\"verbose\":false,\"pedantic\":false,\"tls_required\":false}\r\nPING\r\n"); err != nil {
		t.Logf("write refused: %v", err)
		return
	}
	var got strings.Builder
	for {
		line, err := r.ReadString('\n')
		got.WriteString(line)
		if strings.HasPrefix(line, "PONG") {
			t.Fatalf("a plaintext client was answered: %q", got.String())
		}
		if err != nil {
			t.Logf("plaintext client: %q, then %v", got.String(), err)
			return
		}
	}
}

// checkRoutesClean: over 15 s of a settled cluster no node logs a failed route TLS
// handshake: every route a node dials (from the routes list or gossip) names a host
// its peer's certificate carries. A repeating route error would drown a real one.
func checkRoutesClean(t *testing.T, st *stack) {
	hold(15 * time.Second)
	var logs string
	for _, n := range natsNodes {
		logs += st.logsSince(t, n, 15*time.Second)
	}
	var bad []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "TLS route handshake error") || strings.Contains(l, "route") && strings.Contains(l, "bad certificate") {
			bad = append(bad, l)
		}
	}
	if len(bad) >= 3 {
		t.Fatalf("%d failed route handshakes in 15 s, e.g. %s", len(bad), bad[0])
	}
	t.Logf("%d failed route handshakes in 15 s", len(bad))
}

// checkRoutesTLS: nats-1's routes need TLS with verified certificates, it has its
// two peers, and a node that speaks plaintext is not let into the cluster.
func checkRoutesTLS(t *testing.T, st *stack) {
	var varz struct {
		Cluster struct {
			TLSRequired bool `json:"tls_required"`
			TLSVerify   bool `json:"tls_verify"`
		} `json:"cluster"`
	}
	monitor(t, st, "/varz", &varz)
	if !varz.Cluster.TLSRequired || !varz.Cluster.TLSVerify {
		t.Fatalf("cluster TLS: %+v", varz.Cluster)
	}
	peers := func() []string {
		var routez struct {
			Routes []struct {
				RemoteName string `json:"remote_name"`
			} `json:"routes"`
		}
		monitor(t, st, "/routez", &routez)
		var names []string
		for _, r := range routez.Routes {
			if !slices.Contains(names, r.RemoteName) {
				names = append(names, r.RemoteName)
			}
		}
		slices.Sort(names)
		return names
	}
	if got := peers(); !slices.Equal(got, []string{"nats-2", "nats-3"}) {
		t.Fatalf("nats-1 routes to %v", got)
	}

	// A rogue node on the compose network, routes in the clear.
	name := project + "-rogue"
	out, err := exec.Command("docker", "run", "-d", "--rm", "--name", name, "--network", project+"_default",
		"meshagent/nats-server:dev", "--name", "rogue", "-p", "4222", "--cluster_name", "meshagent",
		"--cluster", "nats://0.0.0.0:6222", "--routes", "nats-route://nats-1:6222").CombinedOutput()
	if err != nil {
		t.Fatalf("start rogue node: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", name).Run() })
	ipOut, err := exec.Command("docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", name).Output()
	ip := strings.TrimSpace(string(ipOut))
	if err != nil || ip == "" {
		t.Fatalf("rogue's address: %q %v", ipOut, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	reread := time.NewTicker(time.Second) // each read runs docker-compose logs: not often
	defer reread.Stop()
	for ; ; <-reread.C {
		logs := st.compose(t, "logs", "--no-color", "nats-1")
		if hit := slices.IndexFunc(strings.Split(logs, "\n"), func(l string) bool {
			return strings.Contains(l, ip+":") && strings.Contains(l, "TLS") && strings.Contains(l, "handshake")
		}); hit >= 0 {
			t.Logf("nats-1 refused the plaintext route from %s: %s", ip, strings.Split(logs, "\n")[hit])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-1 logged no TLS handshake failure for the rogue at %s", ip)
		}
	}
	if got := peers(); !slices.Equal(got, []string{"nats-2", "nats-3"}) {
		t.Fatalf("with a rogue node around, nats-1 routes to %v", got)
	}
}

// monitor reads one of nats-1's monitoring endpoints.
func monitor(t *testing.T, st *stack, path string, v any) {
	t.Helper()
	if err := st.monitorGet("nats-1", path, v); err != nil {
		t.Fatalf("nats-1 monitoring %s: %v", path, err)
	}
}
