package ca

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// A registration authority's bundle: the external signer's root joins the
// plugged-in root's, endorsed by the mesh CA's key (a pod trusting the mesh root
// takes it), once: reading the unchanged directory again installs and announces
// nothing. The control: without ExtraRoots the bundle is the directory's alone.
func TestPluggedBundleHoldsTheExternalRoots(t *testing.T) {
	now := time.Now()
	root := testkit.NewCA(t, "mesh root", nil, now, 24*time.Hour)
	ext := testkit.NewCA(t, "external signer", nil, now, 24*time.Hour)
	dir := t.TempDir()
	signertest.WriteCACerts(t, dir, root, nil, root.Cert)
	for _, extra := range [][]*x509.Certificate{nil, {ext.Cert, root.Cert}} {
		auth := &Authority{}
		rec := &recorder{}
		p := NewPlugged(dir, time.Hour, "cluster.local", auth, rec.notify, hclog.NewNullLogger(), clock.NewFake(now))
		p.ExtraRoots = extra
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		m := auth.Current()
		want := 1
		if extra != nil {
			want = 2 // the mesh root given again is not added twice
		}
		if len(m.Roots) != want || !m.Roots[0].Equal(root.Cert) || (extra != nil && !m.Roots[1].Equal(ext.Cert)) {
			t.Fatalf("extra %d: bundle of %d roots, want %d, the mesh root first", len(extra), len(m.Roots), want)
		}
		if err := endorsed([]*x509.Certificate{root.Cert}, m); err != nil {
			t.Fatalf("extra %d: %v", len(extra), err)
		}
		if p.Reload(context.Background()) || auth.Current() != m || len(rec.all()) != 0 {
			t.Fatalf("extra %d: an unchanged directory was installed again", len(extra))
		}
	}
}

// The bundle's bound holds with the external roots: more than MaxRoots is refused.
func TestAddRootsKeepsTheBound(t *testing.T) {
	now := time.Now()
	root := testkit.NewCA(t, "mesh root", nil, now, time.Hour)
	m, err := NewMaterial(root.Key, root.Cert, nil, []*x509.Certificate{root.Cert}, 1, now)
	if err != nil {
		t.Fatal(err)
	}
	var many []*x509.Certificate
	for range MaxRoots {
		many = append(many, testkit.NewCA(t, "external", nil, now, time.Hour).Cert)
	}
	if err := m.AddRoots(many[:MaxRoots-1]); err != nil || len(m.RootPEMs()) != MaxRoots {
		t.Fatalf("up to the bound: %v, %d roots", err, len(m.RootPEMs()))
	}
	if err := m.AddRoots(many); err == nil {
		t.Fatal("a bundle over the bound was accepted")
	}
}
