package trustbundle

import (
	"errors"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestVerifySignerTakesOnlyWhatTheMeshCAEndorsed: a named signer's roots are
// taken when the mesh CA (or its intermediate, with the chain) endorsed them for
// that signer; not when another key did, not as another signer's, not as another
// trust domain's, and not when the roots were swapped after endorsing.
func TestVerifySignerTakesOnlyWhatTheMeshCAEndorsed(t *testing.T) {
	mesh, partner, stranger := root(t, "mesh"), root(t, "partner"), root(t, "stranger")
	inter := testkit.NewCA(t, "mesh-int", mesh, time.Now(), time.Hour)
	roots := []string{partner.PEM()}
	sign := func(t *testing.T, domain, name string, by *testkit.CA) events.SignerRoots {
		t.Helper()
		es, err := EndorseSigner(domain, name, roots, by.Key)
		if err != nil {
			t.Fatal(err)
		}
		return events.SignerRoots{Name: name, Roots: roots, Endorsements: es}
	}
	trusted := certs(mesh)

	got, err := VerifySigner(trusted, td, sign(t, td, "partner", mesh))
	if err != nil || len(got) != 1 || !got[0].Equal(partner.Cert) {
		t.Fatalf("mesh-endorsed signer roots: %v, %v", got, err)
	}
	viaInter, err := EndorseSigner(td, "partner", roots, inter.Key)
	if err != nil {
		t.Fatal(err)
	}
	viaInter[0].Chain = pki.CertPEMs(certs(inter))
	if _, err := VerifySigner(trusted, td, events.SignerRoots{Name: "partner", Roots: roots, Endorsements: viaInter}); err != nil {
		t.Fatalf("endorsed by the mesh's intermediate: %v", err)
	}

	for name, s := range map[string]events.SignerRoots{
		"another key":          sign(t, td, "partner", stranger),
		"another signer":       func() events.SignerRoots { s := sign(t, td, "other", mesh); s.Name = "partner"; return s }(),
		"another trust domain": sign(t, "other.example", "partner", mesh),
		"swapped roots": func() events.SignerRoots {
			s := sign(t, td, "partner", mesh)
			s.Roots = []string{stranger.PEM()}
			return s
		}(),
		"not endorsed": {Name: "partner", Roots: roots},
	} {
		t.Run(name, func(t *testing.T) {
			if got, err := VerifySigner(trusted, td, s); !errors.Is(err, ErrRejected) || got != nil {
				t.Fatalf("VerifySigner = %v, %v; want ErrRejected", got, err)
			}
		})
	}
	// A signer endorsement is not a bundle's, nor a foreign domain's.
	es, _ := EndorseSigner(td, "partner", roots, keys(mesh)...)
	if _, err := endorsed(trusted, Bundle{TrustDomain: td, Generation: 0, Roots: roots, Endorsements: es}); err == nil {
		t.Fatal("a signer endorsement verified as a bundle's")
	}
}
