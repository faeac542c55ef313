package signer

import (
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
)

// A pod asking for a certificate longer than -pod-max-ttl gets the cap (not a
// refusal); a request for no pod keeps -max-ttl.
func TestPodTTLClamped(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("signer-a")
	cfg.Certs.PodMaxTTL = 2 * time.Hour
	e.start(t, cfg)
	_, csr := signertest.CSR(t, pki.ECP256, askedID)
	rep := natsSignAs(t, e.nc, "web-0", events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web"), TTL: 2159 * time.Hour, Pod: events.PodRef{Namespace: "shop", Name: "web-0"}})
	if rep.Error != nil {
		t.Fatal(rep.Error)
	}
	leaf := verifyChain(t, rep.CertChain, rep.Roots, time.Now())
	if got := leaf.NotAfter.Sub(leaf.NotBefore); got != 2*time.Hour+ca.Backdate {
		t.Fatalf("a pod asking 2159h got %s, want the pods' cap 2h", got)
	}
	if ev := last[events.CertIssued](t, e.js, events.SubjectCertIssued); !ev.NotAfter.Equal(leaf.NotAfter) || ev.Pod != (events.PodRef{Namespace: "shop", Name: "web-0"}) {
		t.Fatalf("cert.issued %+v", ev)
	}
	// An operator's request for no pod: -max-ttl still bounds it, the pods' cap does not.
	_, csr = signertest.CSR(t, pki.ECP256, askedID)
	rep = natsSign(t, e.nc, events.SignRequest{CSR: string(csr), Token: e.token(t, "shop", "web"), TTL: 48 * time.Hour})
	if rep.Error != nil {
		t.Fatal(rep.Error)
	}
	if got := verifyChain(t, rep.CertChain, rep.Roots, time.Now()); got.NotAfter.Sub(got.NotBefore) != 48*time.Hour+ca.Backdate {
		t.Fatalf("a request for no pod asking 48h got %s", got.NotAfter.Sub(got.NotBefore))
	}
}
