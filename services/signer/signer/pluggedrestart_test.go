package signer

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestPluggedRootSwapStaysRefusedAfterRestart: a cacerts swap to an unrelated root
// is refused at reload, but the next start installed it, and then the original
// files were refused as well (checked against the stranger's bundle). The signers
// keep the roots of the material installed last in their CA bucket, and a start
// checks the directory against them: the stranger is refused again, nothing is
// signed under it, and the original files put back are installed (the positive
// control) without a second restart.
func TestPluggedRootSwapStaysRefusedAfterRestart(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	root, inter, dir := pluggedCADir(t, now)
	c := e.config("signer-p")
	c.CA.Dir = dir
	c.CA.ReloadDelay = 20 * time.Millisecond
	first := e.build(t, c, nil)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- lifecycle.Tasks(ctx, first.http.Run, first.Run) }()
	testkit.EventuallyWithin(t, 20*time.Second, "first signer ready", func() bool { return first.ready() == nil })

	stranger := testkit.NewCA(t, "root", nil, now, 96*time.Hour) // the same name, another key
	strangerInter := testkit.NewCA(t, "inter", stranger, now, 24*time.Hour)
	signertest.WriteCACerts(t, dir, strangerInter, []*x509.Certificate{stranger.Cert}, stranger.Cert)
	testkit.EventuallyWithin(t, 10*time.Second, "swap refused at reload", func() bool {
		return first.source.(*ca.Plugged).Rejected() >= 1
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Restart onto the stranger's files: refused again.
	c.Instance = "signer-p2"
	s := e.build(t, c, nil)
	s.run(t)
	plugged := s.source.(*ca.Plugged)
	testkit.EventuallyWithin(t, 20*time.Second, "swap refused at start-up", func() bool { return plugged.Rejected() >= 1 })
	if cur := s.auth.Current(); cur != nil {
		t.Fatalf("the restart installed %s", cur.RootFingerprint())
	}
	// The signer is not ready (no CA), but its NATS API subscribes all the same:
	// asked before, a request finds no responder, which proves nothing.
	testkit.EventuallyWithin(t, 20*time.Second, "the restarted signer's NATS API subscribed", func() bool { return s.nats.Ready() == nil })
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	if rep := natsSign(t, e.nc, events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web")}); rep.Error == nil {
		t.Fatal("signed under the refused root")
	}

	// The original files back: installed, signing under the original root.
	signertest.WriteCACerts(t, dir, inter, []*x509.Certificate{root.Cert}, root.Cert)
	testkit.EventuallyWithin(t, 10*time.Second, "the original material back", func() bool {
		cur := s.auth.Current()
		return cur != nil && cur.Cert.Equal(inter.Cert)
	})
	rep := natsSign(t, e.nc, events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web")})
	if rep.Error != nil {
		t.Fatal(rep.Error)
	}
	if certs := mustCerts(t, rep.CertChain); !certs[len(certs)-1].Equal(root.Cert) {
		t.Fatal("the reply does not end at the original root")
	}
}
