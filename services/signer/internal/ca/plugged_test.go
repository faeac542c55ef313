package ca

import (
	"context"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// A plugged-in root swapped for an unrelated one (neither cross-signed by the
// current root nor leaving the CA under it) is refused with a clear error: the
// material, the bundle and the announcements stay as they were, and the refusal is
// counted. The same new root cross-signed by the current one (its cross certificate
// in cert-chain.pem) is installed, and its endorsement verifies for a pod trusting
// only the old root. With -cacerts-force-root-change the unrelated one is installed.
func TestPluggedRootSwapThatWouldStrandTheFleet(t *testing.T) {
	t0 := time.Now() // the pod's endorsement check runs at the real time
	rot := testkit.NewRotation(t, t0, 48*time.Hour)
	inter := testkit.NewCA(t, "inter", rot.Old, t0, 24*time.Hour)
	dir := t.TempDir()
	signertest.WriteCACerts(t, dir, inter, []*x509.Certificate{rot.Old.Cert}, rot.Old.Cert)
	auth := &Authority{}
	rec := &recorder{}
	p := NewPlugged(dir, time.Hour, "cluster.local", auth, rec.notify, hclog.NewNullLogger(), clock.NewFake(t0))
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	first := auth.Current()

	stranger := testkit.NewCA(t, "meshagent root CA", nil, t0, 48*time.Hour)
	inter2 := testkit.NewCA(t, "inter2", stranger, t0, 24*time.Hour)
	signertest.WriteCACerts(t, dir, inter2, []*x509.Certificate{stranger.Cert}, stranger.Cert, rot.Old.Cert)
	m, err := LoadDir(dir, t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := continuous(first, m, t0); !errors.Is(err, ErrFleetWouldRefuse) || !strings.Contains(err.Error(), "cacerts-force-root-change") {
		t.Fatalf("continuity check: %v", err)
	}
	if p.Reload(context.Background()) {
		t.Fatal("a root swap that strands the fleet was installed")
	}
	if auth.Current() != first || len(rec.all()) != 0 || p.Rejected() != 1 {
		t.Fatalf("after the refusal: material kept %t, %d announcements, %d rejected", auth.Current() == first, len(rec.all()), p.Rejected())
	}

	// The new root cross-signed by the current one: installed and followed.
	inter3 := testkit.NewCA(t, "inter3", rot.New, t0, 24*time.Hour)
	signertest.WriteCACerts(t, dir, inter3, []*x509.Certificate{rot.Cross, rot.New.Cert}, rot.New.Cert, rot.Old.Cert)
	if !p.Reload(context.Background()) {
		t.Fatal("a cross-signed new root was refused")
	}
	cur := auth.Current()
	if err := signertest.VerifyEndorsed([]*x509.Certificate{rot.Old.Cert}, "cluster.local", cur.Generation, cur.RootPEMs(), cur.Endorsements()); err != nil {
		t.Fatalf("a pod trusting only the old root cannot follow: %v", err)
	}

	// Forced: the stranger is installed.
	signertest.WriteCACerts(t, dir, inter2, []*x509.Certificate{stranger.Cert}, stranger.Cert)
	p.ForceRootChange = true
	if !p.Reload(context.Background()) || auth.Current().RootFingerprint() != pki.Fingerprint(stranger.Cert) {
		t.Fatal("a forced root change was not installed")
	}
}
