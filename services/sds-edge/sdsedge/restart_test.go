package sdsedge_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/testkit"
	"github.com/meshagent/meshagent/services/sds-edge/internal/config"
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

	// A stranger's CA on another bus: first use would take it.
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
