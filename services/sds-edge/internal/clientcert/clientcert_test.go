package clientcert

import (
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/atomicfile/certdir"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/tests/testkit"
)

// The pod's own certificate while it has a valid one, else the provisioned one
// while that is valid, else none, saying why.
func TestPresentsTheCurrentCertificateElseTheProvisionedOne(t *testing.T) {
	now := time.Now()
	ca := testkit.NewCA(t, "mesh", nil, now, 24*time.Hour)
	prov := ca.Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/shop/sa/web", NotBefore: now.Add(-time.Minute), Life: time.Hour})
	dir := t.TempDir()
	if err := certdir.Write(dir, []byte(prov.KeyPEM(t)), []byte(prov.PEM()), []byte(ca.PEM())); err != nil {
		t.Fatal(err)
	}
	s := New(dir)
	if c, err := s.Get(); err != nil || !c.Leaf.Equal(prov.Cert) {
		t.Fatalf("before the CA flow: %v, want the provisioned certificate", err)
	}
	own := ca.Issue(t, testkit.Spec{ID: "spiffe://cluster.local/ns/shop/sa/web"})
	var current *tls.Certificate
	clk := clock.NewFake(now)
	s.Use(func() (*tls.Certificate, error) {
		if current == nil {
			return nil, errors.New("no certificate yet")
		}
		return current, nil
	}, clk)
	if c, err := s.Get(); err != nil || !c.Leaf.Equal(prov.Cert) {
		t.Fatalf("no certificate of its own yet: %v, want the provisioned one", err)
	}
	ownTLS := own.TLS()
	current = &ownTLS
	if c, err := s.Get(); err != nil || c != current {
		t.Fatalf("with its own certificate: %v, want it", err)
	}
	// Its own gone, the provisioned one expired.
	current = nil
	clk.Set(now.Add(2 * time.Hour))
	if _, err := s.Get(); err == nil || !strings.Contains(err.Error(), "expired") || !strings.Contains(err.Error(), "no certificate yet") {
		t.Fatalf("nothing valid: %v, want an error naming both", err)
	}
	if _, err := New("").Get(); err == nil {
		t.Fatal("no provisioned certificate and no CA flow: got one")
	}
	if err := os.Remove(filepath.Join(dir, certdir.KeyFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir, now); err == nil {
		t.Fatal("loaded a provisioned certificate without its key")
	}
}
