package ca

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// tlsPod is a pod holding a certificate from one sign reply: what it presents in a
// handshake and what it trusts. An Istio agent trusts the reply's last PEM alone; a
// meshagent pod trusts the bundle, which follows trust.changed.
type tlsPod struct {
	name  string
	reply []*x509.Certificate // leaf first, the reply's last PEM last
	key   crypto.Signer
	trust []*x509.Certificate
	istio bool
	born  time.Time
}

// renewPod signs a leaf under m at now. Its lifetime is two days whatever the
// phases' clock says, so that it is valid at the real time the handshakes run at
// (the rotation's clock runs a day in the past); which pods still hold their
// certificate is decided by the rotation's clock (maxTTL).
func renewPod(t *testing.T, name string, m *Material, now time.Time, istio bool) *tlsPod {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := url.Parse("spiffe://cluster.local/ns/default/sa/" + name)
	leaf, err := m.SignLeaf(key.Public(), id, now, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &tlsPod{name: name, reply: append([]*x509.Certificate{leaf}, m.Chain...), key: key, istio: istio, born: now}
	p.trust = m.Roots
	if istio {
		p.trust = p.reply[len(p.reply)-1:]
	}
	return p
}

// shape names what decides a verification: the chain above the leaf, the key that
// signed the leaf and the roots trusted (leaves of one shape verify alike).
func shape(presented []*x509.Certificate, trust []*x509.Certificate) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%x|", presented[0].AuthorityKeyId)
	for _, c := range presented[1:] {
		b.WriteString(pki.Fingerprint(c)[:12] + ",")
	}
	b.WriteString("|")
	for _, c := range trust {
		b.WriteString(pki.Fingerprint(c)[:12] + ",")
	}
	return b.String()
}

// goMutualTLS runs one mutual TLS handshake in Go's crypto/tls over loopback: server
// presents its chain and requires client's, which it verifies under its own trust;
// the client verifies the server's chain under its own (as a SPIFFE peer does: by
// chain, not by host name). It returns the first side's error.
func goMutualTLS(client, server *tlsPod, presented func(*tlsPod) []*x509.Certificate) error {
	tc := func(p *tlsPod) tls.Certificate {
		c := tls.Certificate{PrivateKey: p.key}
		for _, x := range presented(p) {
			c.Certificate = append(c.Certificate, x.Raw)
		}
		return c
	}
	pool := func(cs []*x509.Certificate) *x509.CertPool {
		p := x509.NewCertPool()
		for _, c := range cs {
			p.AddCert(c)
		}
		return p
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	srvErr := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		s := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{tc(server)}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool(server.trust)})
		srvErr <- s.Handshake()
	}()
	roots := pool(client.trust)
	cfg := &tls.Config{Certificates: []tls.Certificate{tc(client)}, InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			return err
		}}
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := tls.DialWithDialer(&d, "tcp", ln.Addr().String(), cfg)
	if err == nil {
		_ = c.Close()
	}
	if serr := <-srvErr; serr != nil && err == nil {
		return fmt.Errorf("server %s: %w", server.name, serr)
	}
	if err != nil {
		return fmt.Errorf("client %s: %w", client.name, err)
	}
	return nil
}

// Across a rotation to a new key, at every phase boundary (just before and just
// after it) every two pods that still hold a certificate complete TLS handshakes in
// both directions in Go's crypto/tls (mutual), OpenSSL 3 (s_client) and BoringSSL
// (bssl-tool client), each trusting only its own ROOTCA: Istio agents the last PEM
// of their reply, meshagent pods the bundle. Each presents its reply as sds-edge
// serves it (root included) and without the last PEM (as a peer that strips the
// root does). OpenSSL and BoringSSL failed here when the cross-signed certificate
// had no Authority Key Identifier: they took it for a self-signed root.
func TestPhaseChainsHandshakeInEveryTLSStack(t *testing.T) {
	stacks := []string{testkit.StackOpenSSL, testkit.StackBoringSSL}
	for _, s := range stacks {
		testkit.TLSTool(t, s)
	}
	s := bustest.Server(t)
	// The phases' clock runs a day behind, so that every certificate the handshakes
	// see is valid at the real time they run at.
	start := time.Now().Add(-24 * time.Hour).Truncate(time.Second)
	fake := clock.NewFake(start)
	r := newReplica(t, bustest.JetStream(t, bustest.Conn(t, s)), fake)
	r.src.cfg.RootTTL = 100 * 24 * time.Hour
	const maxTTL = time.Hour
	r.src.cfg.MaxLeafTTL = maxTTL
	ctx := context.Background()
	if err := r.src.Start(ctx); err != nil {
		t.Fatal(err)
	}
	step := r.src.PhaseStep()
	var pods []*tlsPod
	renew := func(label string) {
		m := r.auth.Current()
		pods = append(pods, renewPod(t, "istio-"+label, m, fake.Now(), true), renewPod(t, "mesh-"+label, m, fake.Now(), false))
	}
	renew("before")
	fake.Add(time.Minute)
	if _, err := r.src.Rotate(ctx, true); err != nil {
		t.Fatal(err)
	}
	rotAt := fake.Now()
	var oldRoot *x509.Certificate // the root before the rotation, also once retired
	checkpoints := []struct {
		label string
		at    time.Duration
		phase Phase
	}{
		{"phase1-start", 0, PhaseCrossOldLast},
		{"phase1-end", step - time.Second, PhaseCrossOldLast},
		{"phase2-start", step, PhaseCrossNewLast},
		{"phase2-end", 2*step - time.Second, PhaseCrossNewLast},
		{"phase3-start", 2 * step, PhaseSettled},
		{"old-root-leaves", 3*step - time.Second, PhaseSettled},
		{"old-root-left", 3 * step, PhaseSettled},
	}
	presentations := map[string]func(*tlsPod) []*x509.Certificate{
		"reply":        func(p *tlsPod) []*x509.Certificate { return p.reply },
		"without-root": func(p *tlsPod) []*x509.Certificate { return p.reply[:len(p.reply)-1] },
	}
	handshakes, seen := 0, map[string]error{}
	for _, cp := range checkpoints {
		fake.Set(rotAt.Add(cp.at))
		if err := r.src.Check(ctx); err != nil {
			t.Fatal(err)
		}
		m := r.auth.Current()
		if m.Phase() != cp.phase {
			t.Fatalf("%s: phase %s, want %s", cp.label, m.Phase(), cp.phase)
		}
		renew(cp.label)
		// The CA's own gRPC endpoint: a client trusting only the old root (an Istio
		// agent restarted with the root mounted before the rotation, or a pod started
		// with a stale mounted root after the old root left the bundle) reaches it
		// for as long as the old root is valid (issue 37: after retirement such a pod
		// retried for ever on "certificate signed by unknown authority").
		skey, err := pki.GenerateKey(pki.ECP256)
		if err != nil {
			t.Fatal(err)
		}
		sleaf, err := m.SignServing(skey.Public(), []string{"istiod.istio-system.svc"}, []net.IP{net.ParseIP("127.0.0.1")}, fake.Now(), 48*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		serving := append([]*x509.Certificate{sleaf}, m.ServingIntermediates()...)
		trusts := map[string][]*x509.Certificate{"new root": {m.Roots[0]}, "the bundle": m.Roots}
		if len(m.Roots) > 1 {
			oldRoot = m.Roots[len(m.Roots)-1]
		}
		if oldRoot != nil && !oldRoot.Equal(m.Roots[0]) {
			trusts["old root"] = []*x509.Certificate{oldRoot}
		}
		for tname, trust := range trusts {
			for _, stack := range stacks {
				if err := testkit.ToolAccepts(t, stack, serving, skey, trust); err != nil {
					t.Errorf("%s: a client trusting the %s does not reach the CA's gRPC endpoint: %v", cp.label, tname, err)
				}
				handshakes++
			}
		}
		var live []*tlsPod
		for _, p := range pods {
			if fake.Now().Sub(p.born) < maxTTL {
				if !p.istio {
					p.trust = m.Roots // ROOTCA follows trust.changed
				}
				live = append(live, p)
			}
		}
		for _, a := range live {
			for _, b := range live {
				if a == b {
					continue
				}
				if err := goMutualTLS(a, b, presentations["reply"]); err != nil {
					t.Errorf("%s: Go: %s and %s: %v", cp.label, a.name, b.name, err)
				}
				handshakes++
				for pname, present := range presentations {
					chain := present(b)
					for _, stack := range stacks {
						k := stack + "|" + shape(chain, a.trust)
						err, done := seen[k]
						if !done {
							err = testkit.ToolAccepts(t, stack, chain, b.key, a.trust)
							seen[k] = err
							handshakes++
						}
						if err != nil {
							t.Errorf("%s: %s (trusting %d roots) rejects %s presenting its %s (%d certs): %v", cp.label, a.name, len(a.trust), b.name, pname, len(chain), err)
						}
					}
				}
			}
		}
	}
	if handshakes < 50 {
		t.Fatalf("only %d handshakes ran", handshakes)
	}
	t.Logf("%d handshakes, %d distinct tool verifications", handshakes, len(seen))
	if m := r.auth.Current(); len(m.Roots) != 1 {
		t.Fatalf("the old root did not leave: %d roots", len(m.Roots))
	}
}
