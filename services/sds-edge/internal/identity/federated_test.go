package identity

import (
	"crypto/x509"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
	"github.com/meshagent/meshagent/tests/testkit"
)

type nopObserver struct{ rejected int }

func (*nopObserver) Changed(*secrets.Entry, int) {}
func (*nopObserver) Files(_, _, _ []byte)        {}
func (*nopObserver) CSR(error, bool)             {}
func (o *nopObserver) TrustRejected(string)      { o.rejected++ }
func (*nopObserver) TrustBootstrapped(string)    {}

// A pod serves ROOTCA_SPIFFE with its own roots and each followed domain's under
// its own name, taking a foreign bundle only when its own CA endorsed it.
func TestFederatedBundlesReachTheSPIFFEValidationContext(t *testing.T) {
	home := testkit.NewCA(t, "home", nil, time.Now(), time.Hour)
	west := testkit.NewCA(t, "west", nil, time.Now(), time.Hour)
	mallory := testkit.NewCA(t, "mallory", nil, time.Now(), time.Hour)
	store := secrets.New(nil)
	obs := &nopObserver{}
	m := New(Config{TrustDomain: "cluster.local", Anchors: []*x509.Certificate{home.Cert}}, nil, store, obs, clock.Real{}, hclog.NewNullLogger())
	roots := pki.CertPEMs([]*x509.Certificate{home.Cert})
	es, err := trustbundle.Endorse("cluster.local", 1, roots, home.Key)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ApplyBundle(SourceTrustChanged, trustbundle.Bundle{TrustDomain: "cluster.local", Generation: 1, Roots: roots, Endorsements: es}); err != nil {
		t.Fatal(err)
	}
	ev := func(by *testkit.CA) events.TrustFederated {
		e := events.TrustFederated{TrustDomain: "cluster.local", Foreign: "west.example", Roots: pki.CertPEMs([]*x509.Certificate{west.Cert}), Version: 1}
		e.Endorsements, err = trustbundle.EndorseFederated(e.TrustDomain, e.Foreign, e.Version, e.Roots, by.Key)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	if err := m.Federated(ev(mallory)); err == nil || obs.rejected != 1 {
		t.Fatalf("a foreign bundle endorsed by another key: err %v, rejected %d", err, obs.rejected)
	}
	if err := m.Federated(ev(home)); err != nil {
		t.Fatal(err)
	}
	tds := spiffeDomains(t, store)
	if len(tds) != 2 || tds[0].GetName() != "cluster.local" || tds[1].GetName() != "west.example" ||
		string(tds[1].GetTrustBundle().GetInlineBytes()) != west.PEM() {
		t.Fatalf("trust domains = %v", tds)
	}
	if rootca, _ := store.Get(secrets.RootCA); rootca == nil {
		t.Fatal("plain ROOTCA gone")
	}
}

// TRUST_DOMAIN_ALIASES: an alias is verified against this domain's own roots in
// ROOTCA_SPIFFE, beside the domain itself.
func TestTrustDomainAliasesVerifyAgainstOurRoots(t *testing.T) {
	home := testkit.NewCA(t, "home", nil, time.Now(), time.Hour)
	store := secrets.New(nil)
	m := New(Config{TrustDomain: "cluster.local", TrustDomainAliases: []string{"old.example"}, Anchors: []*x509.Certificate{home.Cert}},
		nil, store, &nopObserver{}, clock.Real{}, hclog.NewNullLogger())
	roots := pki.CertPEMs([]*x509.Certificate{home.Cert})
	es, err := trustbundle.Endorse("cluster.local", 1, roots, home.Key)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ApplyBundle(SourceTrustChanged, trustbundle.Bundle{TrustDomain: "cluster.local", Generation: 1, Roots: roots, Endorsements: es}); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, td := range spiffeDomains(t, store) {
		got[td.GetName()] = string(td.GetTrustBundle().GetInlineBytes())
	}
	if len(got) != 2 || got["old.example"] != home.PEM() || got["cluster.local"] != home.PEM() {
		t.Fatalf("trust domains = %v", got)
	}
}

// spiffeDomains is the trust domains of the store's ROOTCA_SPIFFE, as Envoy's
// SPIFFE validator would read them.
func spiffeDomains(t *testing.T, store *secrets.Store) []*tlsv3.SPIFFECertValidatorConfig_TrustDomain {
	t.Helper()
	e, ok := store.Get(secrets.SPIFFERootCA)
	if !ok {
		t.Fatal("no ROOTCA_SPIFFE")
	}
	var sec tlsv3.Secret
	var cfg tlsv3.SPIFFECertValidatorConfig
	if err := proto.Unmarshal(e.Any.Value, &sec); err != nil || e.Any.TypeURL != sdsclient.SecretTypeURL {
		t.Fatalf("%s: %v", e.Any.TypeURL, err)
	}
	if err := sec.GetValidationContext().GetCustomValidatorConfig().GetTypedConfig().UnmarshalTo(&cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.GetTrustDomains()
}
