package sdsedge_test

import (
	"crypto"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/atomicfile/certdir"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/sds-edge/internal/config"
	"github.com/meshagent/meshagent/tests/testkit"
)

// A restarted sds-edge trusts what it trusted before (kept under the pod root,
// 0600), not the first bundle it hears: after a restart onto a bus where a stranger
// CA answers, the stranger's replies are refused and nothing is served; back on the
// genuine CA, which rotated to a new key meanwhile, the pod follows the rotation
// (the bundle is endorsed by the key it kept) and the state file holds both roots.
func TestRestartedPodTrustsWhatItTrustedBefore(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	root := p.cfg.Pod.RootDir
	state := filepath.Join(root, config.DefaultTrustState)
	genuine := pki.Fingerprint(v.ca.roots[0])
	testkit.Eventually(t, "trusted roots kept", func() bool {
		b, err := os.ReadFile(state)
		return err == nil && len(fingerprints(t, b)) == 1 && fingerprints(t, b)[0] == genuine
	})
	if fi, err := os.Stat(state); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode: %v, %v", fi.Mode(), err)
	}
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}

	// A stranger's CA on another bus: first use would take it. (The kept
	// certificate is removed, so that the restarted pod asks a CA at once.)
	if err := os.Remove(filepath.Join(root, config.DefaultCertState)); err != nil {
		t.Fatal(err)
	}
	stranger := newEnv(t)
	q := stranger.startPod(podOpt{root: root})
	testkit.Eventually(t, "stranger's replies refused", func() bool { return q.rejected(t, "sign-reply") >= 3 })
	if q.e.Ready() == nil {
		t.Fatal("ready on a stranger's certificate")
	}
	if b, _ := os.ReadFile(state); len(fingerprints(t, b)) != 1 || fingerprints(t, b)[0] != genuine {
		t.Fatal("the stranger's root was kept")
	}
	if err := q.stop(); err != nil {
		t.Fatal(err)
	}

	// Back on the genuine CA, rotated meanwhile.
	newRoot := pki.Fingerprint(v.ca.rotate(t))
	r := v.startPod(podOpt{root: root})
	testkit.EventuallyWithin(t, 15*time.Second, "serving under the rotated root", func() bool { return r.e.Ready() == nil })
	got := r.fetch(t, "ROOTCA")
	fps := fingerprints(t, got["ROOTCA"].TrustedCA)
	if len(fps) != 2 || fps[0] != newRoot || fps[1] != genuine {
		t.Fatalf("ROOTCA %v, want the new root then the old", fps)
	}
	testkit.Eventually(t, "both roots kept", func() bool {
		b, _ := os.ReadFile(state)
		return len(fingerprints(t, b)) == 2
	})
}

// A restarted sds-edge serves the certificate it kept (0600, beside the trust
// state) at once, without asking the CA: the same serial comes back over SDS. A
// kept certificate that is not for the kept key is not served: the pod asks the CA
// for a new one.
func TestRestartedPodServesItsKeptCertificateAtOnce(t *testing.T) {
	v := newEnv(t)
	p := v.startPod(podOpt{})
	root := p.cfg.Pod.RootDir
	testkit.Eventually(t, "ready", func() bool { return p.e.Ready() == nil })
	first := leafOf(t, p.fetch(t, "default")["default"])
	state := filepath.Join(root, config.DefaultCertState)
	testkit.Eventually(t, "certificate kept", func() bool {
		b, err := os.ReadFile(state)
		return err == nil && strings.Contains(string(b), "PRIVATE KEY") && strings.Contains(string(b), "CERTIFICATE")
	})
	if fi, err := os.Stat(state); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kept certificate's mode: %v, %v", fi.Mode(), err)
	}
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	q := v.startPod(podOpt{root: root})
	got := leafOf(t, q.fetch(t, "default")["default"])
	took := time.Since(began)
	if pki.SerialHex(got) != pki.SerialHex(first) {
		t.Fatalf("after the restart the pod served %s, not its kept %s", pki.SerialHex(got), pki.SerialHex(first))
	}
	t.Logf("restarted sds-edge served its kept certificate %s after the start (New, Run, SDS fetch)", took.Round(100*time.Microsecond))
	if err := q.stop(); err != nil {
		t.Fatal(err)
	}

	// A kept chain with another key: refused, and a new certificate is issued.
	b, _ := os.ReadFile(state)
	other, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	otherPEM, err := pki.EncodeKeyPEM(other, false)
	if err != nil {
		t.Fatal(err)
	}
	certs := string(b[strings.Index(string(b), "-----BEGIN CERTIFICATE-----"):])
	if err := os.WriteFile(state, append(otherPEM, certs...), 0o600); err != nil {
		t.Fatal(err)
	}
	r := v.startPod(podOpt{root: root})
	testkit.Eventually(t, "ready again", func() bool { return r.e.Ready() == nil })
	if again := leafOf(t, r.fetch(t, "default")["default"]); pki.SerialHex(again) == pki.SerialHex(first) {
		t.Fatal("a kept certificate that is not for the kept key was served")
	}
}

// With KEEP_CERT off, nothing is kept under the pod root, but a restarted pod
// still serves at once what OUTPUT_CERTS holds (key.pem, cert-chain.pem).
func TestRestartedPodServesOutputCertsWhenNothingIsKept(t *testing.T) {
	v := newEnv(t)
	args := []string{"-keep-cert=false", "-output-certs", "etc/certs"}
	p := v.startPod(podOpt{args: args})
	root := p.cfg.Pod.RootDir
	testkit.Eventually(t, "ready", func() bool { return p.e.Ready() == nil })
	first := leafOf(t, p.fetch(t, "default")["default"])
	testkit.Eventually(t, "OUTPUT_CERTS written", func() bool {
		_, err := os.Stat(filepath.Join(root, "etc/certs/cert-chain.pem"))
		return err == nil
	})
	if _, err := os.Stat(filepath.Join(root, config.DefaultCertState)); !os.IsNotExist(err) {
		t.Fatalf("the pair was kept under the pod root with -keep-cert=false: %v", err)
	}
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	q := v.startPod(podOpt{root: root, args: args})
	if got := leafOf(t, q.fetch(t, "default")["default"]); pki.SerialHex(got) != pki.SerialHex(first) {
		t.Fatalf("after the restart the pod served %s, not %s from OUTPUT_CERTS", pki.SerialHex(got), pki.SerialHex(first))
	}
}

// TestRestartedPodWritesOutputCertsWhole: after a restart sds-edge served its kept
// certificate and wrote OUTPUT_CERTS with an empty root-cert.pem until its first
// renewal (hours with Istio's 24 h certificates): the roots it trusted before the
// restart are written with the key and chain, one set, whose key is the chain's.
func TestRestartedPodWritesOutputCertsWhole(t *testing.T) {
	v := newEnv(t)
	args := []string{"-output-certs", "etc/certs"}
	p := v.startPod(podOpt{args: args})
	root := p.cfg.Pod.RootDir
	testkit.Eventually(t, "ready", func() bool { return p.e.Ready() == nil })
	first := leafOf(t, p.fetch(t, "default")["default"])
	dir := filepath.Join(root, "etc/certs")
	read := func(name string) []byte { b, _ := os.ReadFile(filepath.Join(dir, name)); return b }
	testkit.Eventually(t, "OUTPUT_CERTS written", func() bool { return len(read(certdir.RootFile)) > 0 })
	roots := read(certdir.RootFile)
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	q := v.startPod(podOpt{root: root, args: args})
	if got := leafOf(t, q.fetch(t, "default")["default"]); pki.SerialHex(got) != pki.SerialHex(first) {
		t.Fatalf("after the restart the pod served %s, not its kept %s", pki.SerialHex(got), pki.SerialHex(first))
	}
	// The restored certificate's files are written just after it is served: watch
	// the directory for a while.
	if testkit.Poll(time.Second, func() bool { return len(read(certdir.RootFile)) == 0 }) {
		t.Fatal("root-cert.pem written empty after the restart")
	}
	if got := read(certdir.RootFile); !slices.Equal(fingerprints(t, got), fingerprints(t, roots)) {
		t.Fatalf("root-cert.pem after the restart holds %q, want the roots trusted before", got)
	}
	key, err := pki.ParseKeyPEM(read(certdir.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	chain, err := pki.ParseCertsPEM(read(certdir.ChainFile))
	if err != nil || len(chain) == 0 {
		t.Fatalf("cert-chain.pem: %v", err)
	}
	if !key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(chain[0].PublicKey) {
		t.Fatal("key.pem is not cert-chain.pem's key")
	}
}
