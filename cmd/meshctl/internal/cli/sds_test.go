package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/pkg/xdswire"
	"github.com/meshagent/meshagent/tests/testkit"
)

// Every kind of resource a pod serves prints, ROOTCA_SPIFFE's trust domains
// included (issue 28: it failed with "no CERTIFICATE block"); keys never do.
func TestSDSPrintsEveryResourceKind(t *testing.T) {
	home := testkit.NewCA(t, "home", nil, time.Now(), time.Hour)
	west := testkit.NewCA(t, "west", nil, time.Now(), time.Hour)
	leaf := home.Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/default/sa/web"})
	chain, key := []byte(leaf.PEM()), []byte(leaf.KeyPEM(t))
	served := map[string]sdsclient.Secret{}
	for _, s := range []xdswire.Secret{
		{Name: "default", CertChain: chain, PrivateKey: key},
		{Name: "ROOTCA", TrustedCA: []byte(home.PEM())},
		{Name: "ROOTCA_SPIFFE", SPIFFE: []xdswire.TrustDomain{{Name: "cluster.local", Bundle: []byte(home.PEM())}, {Name: "west.example", Bundle: []byte(west.PEM())}}},
	} {
		// As a client reads it off the wire.
		back, err := xdswire.DecodeSecret(s.Any())
		if err != nil {
			t.Fatal(err)
		}
		served[s.Name] = back
	}
	var out bytes.Buffer
	if err := printSecrets(&out, []string{"default", "ROOTCA", "ROOTCA_SPIFFE", "file-root:/etc/x"}, served); err != nil {
		t.Fatalf("printSecrets: %v", err)
	}
	for _, want := range []string{
		"default    spiffe://cluster.local/ns/default/sa/web serial", "(key present, not shown)",
		"ROOTCA     root CN=home,O=cluster.local sha256 " + pki.Fingerprint(home.Cert)[:16],
		"ROOTCA_SPIFFE trust domain cluster.local root CN=home",
		"ROOTCA_SPIFFE trust domain west.example root CN=west,O=cluster.local sha256 " + pki.Fingerprint(west.Cert)[:16],
		"file-root:/etc/x (not returned)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "PRIVATE KEY") {
		t.Fatal("a private key was printed")
	}
}
