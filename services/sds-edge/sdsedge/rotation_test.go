package sdsedge_test

import (
	"crypto"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

// served is what a pod serves over SDS now: its chain and key (default) and the
// roots it trusts (ROOTCA).
type served struct {
	chain []*x509.Certificate
	key   crypto.Signer
	roots []*x509.Certificate
}

func (p *pod) served(t testing.TB) (served, error) {
	t.Helper()
	cc := p.dial(t)
	got, err := fetch(cc, "default", "ROOTCA")
	if err != nil {
		return served{}, err
	}
	var s served
	if s.chain, err = pki.ParseCertsPEM(got["default"].CertChain); err != nil || len(s.chain) == 0 {
		return served{}, fmt.Errorf("default: %v", err)
	}
	if s.key, err = pki.ParseKeyPEM(got["default"].PrivateKey); err != nil {
		return served{}, fmt.Errorf("default key: %w", err)
	}
	if s.roots, err = pki.ParseCertsPEM(got["ROOTCA"].TrustedCA); err != nil {
		return served{}, fmt.Errorf("ROOTCA: %w", err)
	}
	return s, nil
}

func renewPodNamed(t testing.TB, nc *nats.Conn, podName, serial string) {
	t.Helper()
	pod := events.PodRef{Namespace: "default", Name: podName}
	subj, _ := events.PodRenewSubject(pod)
	msg, err := events.NewMsg(subj, "test-rotator", events.RenewDue{Pod: pod, Serial: serial, Reason: events.RenewScheduled})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
}

func sameCerts(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

func hasAll(roots []*x509.Certificate, want ...*x509.Certificate) bool {
	for _, w := range want {
		found := false
		for _, r := range roots {
			found = found || r.Equal(w)
		}
		if !found {
			return false
		}
	}
	return true
}

// Through every phase of a rotation to a new key, each sds-edge renews on every
// chain shape the signer returns and serves it — over the bus, over gRPC (Istio's
// unendorsed reply) with the old root as -ca-root-cert, and over gRPC started in
// phase 1 with both roots in -ca-root-cert — and every two of them complete TLS
// handshakes both ways in OpenSSL and BoringSSL with what they serve (chain,
// key, ROOTCA). Phase 2's [leaf, cross, new root] failed over the bus and over gRPC
// ("chain[1] not signed by chain[2]"), and a gRPC pod never learned the new root,
// so it could not renew in phase 3.
func TestEveryRotationPhaseRenewsAndHandshakes(t *testing.T) {
	stacks := []string{testkit.StackOpenSSL, testkit.StackBoringSSL}
	for _, s := range stacks {
		testkit.TLSTool(t, s)
	}
	rot := testkit.NewRotation(t, time.Now(), 10*24*time.Hour)
	ca := &testCA{td: "cluster.local", secret: []byte("test-jwt-secret")}
	ca.add(rot.Old)
	v := newEnvCA(t, ca)
	addr := ca.serveGRPC(t) // its TLS certificate is under the old root
	rootFile := func(name string, roots ...*x509.Certificate) (dir, file string) {
		dir = testkit.ShortDir(t)
		file = filepath.Join(dir, name)
		if err := os.WriteFile(file, testkit.CertsPEM(roots), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir, file
	}
	type member struct {
		name string
		p    *pod
	}
	var pods []member
	pods = append(pods, member{testPod, v.startPod(podOpt{})})
	dir, file := rootFile("old-root.pem", rot.Old.Cert)
	pods = append(pods, member{"web-1", v.startPod(podOpt{root: dir, args: []string{"-pod", "web-1", "-ca-addr", addr, "-ca-root-cert", file}})})

	for phase := testkit.PhaseBefore; phase <= testkit.PhaseSettled; phase++ {
		if phase == testkit.PhaseOldLast {
			ca.add(rot.New) // the bundle holds both roots, endorsed by both keys
			dir, file := rootFile("both-roots.pem", rot.New.Cert, rot.Old.Cert)
			pods = append(pods, member{"web-2", v.startPod(podOpt{root: dir, args: []string{"-pod", "web-2", "-ca-addr", addr, "-ca-root-cert", file}})})
		}
		if phase != testkit.PhaseBefore {
			ca.setPhase(rot, phase)
		}
		want := rot.Above(phase)
		now := map[string]served{}
		for _, m := range pods {
			var cur served
			testkit.Eventually(t, fmt.Sprintf("phase %d: %s serves a certificate", phase, m.name), func() bool {
				s, err := m.p.served(t)
				cur = s
				return err == nil
			})
			if !sameCerts(cur.chain[1:], want) {
				renewPodNamed(t, v.nc, m.name, pki.SerialHex(cur.chain[0]))
			}
			testkit.Eventually(t, fmt.Sprintf("phase %d: %s serves the phase's chain", phase, m.name), func() bool {
				s, err := m.p.served(t)
				cur = s
				return err == nil && sameCerts(s.chain[1:], want)
			})
			if time.Now().After(cur.chain[0].NotAfter) {
				t.Fatalf("phase %d: %s serves an expired certificate", phase, m.name)
			}
			wantRoots := rot.Bundle(phase)
			if m.name == "web-1" && phase < testkit.PhaseNewLast {
				wantRoots = rot.Bundle(testkit.PhaseBefore) // Istio's reply tells it nothing before phase 2
			}
			if !hasAll(cur.roots, wantRoots...) || len(cur.roots) != len(wantRoots) {
				t.Fatalf("phase %d: %s trusts %d roots (old %t, new %t), want %d", phase, m.name, len(cur.roots),
					hasAll(cur.roots, rot.Old.Cert), hasAll(cur.roots, rot.New.Cert), len(wantRoots))
			}
			if n := m.p.metric(t, "meshagent_sds_edge_trust_rejected_total"); n != 0 {
				t.Errorf("phase %d: %s rejected %v trust bundles", phase, m.name, n)
			}
			now[m.name] = cur
		}
		for _, a := range pods {
			for _, b := range pods {
				if a.name == b.name {
					continue
				}
				sa, sb := now[a.name], now[b.name]
				for _, stack := range stacks {
					if err := testkit.ToolAccepts(t, stack, sb.chain, sb.key, sa.roots); err != nil {
						t.Errorf("phase %d: %s does not accept %s: %v", phase, a.name, b.name, err)
					}
				}
			}
		}
	}
}
