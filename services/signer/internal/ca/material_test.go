package ca

import (
	"context"
	"crypto/x509"
	"errors"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
)

var t0 = time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)

func TestNewMaterialValidates(t *testing.T) {
	root := testkit.NewCA(t, "root", nil, t0, 24*time.Hour)
	inter := testkit.NewCA(t, "inter", root, t0, 12*time.Hour)
	other := testkit.NewCA(t, "other root", nil, t0, 24*time.Hour)
	tests := []struct {
		name      string
		key       *testkit.CA // key from
		cert      *x509.Certificate
		inter     []*x509.Certificate
		roots     []*x509.Certificate
		wantChain int
		wantErr   string
	}{
		{"root only", root, root.Cert, nil, []*x509.Certificate{root.Cert}, 1, ""},
		{"intermediate", inter, inter.Cert, nil, []*x509.Certificate{root.Cert}, 2, ""},
		{"key does not match", other, inter.Cert, nil, []*x509.Certificate{root.Cert}, 0, "does not match"},
		{"chain does not verify", inter, inter.Cert, nil, []*x509.Certificate{other.Cert}, 0, "does not chain"},
		{"no roots", inter, inter.Cert, nil, nil, 0, "at least one root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := NewMaterial(tt.key.Key, tt.cert, tt.inter, tt.roots, 1, t0)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrInvalidMaterial) || !contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Chain) != tt.wantChain || m.Chain[len(m.Chain)-1] != root.Cert {
				t.Fatalf("chain len %d, last %s", len(m.Chain), m.Chain[len(m.Chain)-1].Subject)
			}
		})
	}
}

func TestSignLeafNeverOutlivesTheCA(t *testing.T) {
	root := testkit.NewCA(t, "root", nil, t0, time.Hour)
	m, err := NewMaterial(root.Key, root.Cert, nil, []*x509.Certificate{root.Cert}, 1, t0)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := pki.GenerateKey(pki.ECP256)
	id, _ := url.Parse("spiffe://cluster.local/ns/a/sa/b")
	leaf, err := m.SignLeaf(k.Public(), id, t0, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !leaf.NotAfter.Equal(root.Cert.NotAfter) {
		t.Fatalf("leaf not_after %s, CA %s", leaf.NotAfter, root.Cert.NotAfter)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() || leaf.Subject.String() != "" || leaf.IsCA {
		t.Fatalf("leaf uris %v subject %q", leaf.URIs, leaf.Subject)
	}
	if _, err := m.SignLeaf(k.Public(), id, t0.Add(2*time.Hour), time.Hour); !errors.Is(err, ErrCAExpired) {
		t.Fatalf("signing after CA expiry: %v", err)
	}
}

func TestLoadDirIstioLayout(t *testing.T) {
	root := testkit.NewCA(t, "root", nil, t0, 24*time.Hour)
	inter := testkit.NewCA(t, "inter", root, t0, 12*time.Hour)
	other := testkit.NewCA(t, "other", nil, t0, 24*time.Hour)
	tests := []struct {
		name    string
		write   func(dir string)
		chain   int
		wantErr string
	}{
		{"intermediate", func(d string) { signertest.WriteCACerts(t, d, inter, []*x509.Certificate{root.Cert}, root.Cert) }, 2, ""},
		{"root only", func(d string) { signertest.WriteCACerts(t, d, root, nil, root.Cert) }, 1, ""},
		{"no cert-chain.pem", func(d string) {
			signertest.WriteCACerts(t, d, inter, nil, root.Cert)
			_ = os.Remove(d + "/" + CertChainFile)
		}, 2, ""},
		{"key does not match cert", func(d string) {
			signertest.WriteCACerts(t, d, &testkit.CA{Cert: inter.Cert, Key: other.Key}, nil, root.Cert)
		}, 0, "does not match"},
		{"chain does not verify", func(d string) { signertest.WriteCACerts(t, d, inter, nil, other.Cert) }, 0, "does not chain"},
		{"missing root-cert.pem", func(d string) {
			signertest.WriteCACerts(t, d, inter, nil, root.Cert)
			_ = os.Remove(d + "/" + RootCertFile)
		}, 0, "root-cert.pem"},
		{"garbage key", func(d string) {
			signertest.WriteCACerts(t, d, inter, nil, root.Cert)
			_ = os.WriteFile(d+"/"+CAKeyFile, []byte("not a key"), 0o600)
		}, 0, "ca-key.pem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.write(dir)
			m, err := LoadDir(dir, t0)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrInvalidMaterial) || !contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Chain) != tt.chain || m.RootFingerprint() != pki.Fingerprint(root.Cert) || m.Generation == 0 {
				t.Fatalf("chain %d root %s gen %d", len(m.Chain), m.RootFingerprint(), m.Generation)
			}
		})
	}
}

type recorder struct {
	mu  sync.Mutex
	got []events.TrustChanged
}

func (r *recorder) notify(_ context.Context, tc events.TrustChanged) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, tc)
	return nil
}

func (r *recorder) all() []events.TrustChanged {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]events.TrustChanged(nil), r.got...)
}

func TestPluggedReloadKeepsOldMaterialWhenNewIsInvalid(t *testing.T) {
	root := testkit.NewCA(t, "root", nil, t0, 24*time.Hour)
	inter := testkit.NewCA(t, "inter", root, t0, 12*time.Hour)
	root2 := testkit.NewCA(t, "root2", nil, t0, 48*time.Hour)
	inter2 := testkit.NewCA(t, "inter2", root2, t0, 12*time.Hour)
	dir := t.TempDir()
	signertest.WriteCACerts(t, dir, inter, []*x509.Certificate{root.Cert}, root.Cert)
	auth := &Authority{}
	rec := &recorder{}
	fake := clock.NewFake(t0)
	p := NewPlugged(dir, 20*time.Millisecond, "cluster.local", auth, rec.notify, hclog.NewNullLogger(), fake)
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	first := auth.Current()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	// Invalid: inter2's key with the old root bundle. Nothing changes.
	signertest.WriteCACerts(t, dir, inter2, nil, root.Cert)
	if p.Reload(context.Background()) {
		t.Fatal("invalid material installed")
	}
	if auth.Current() != first || len(rec.all()) != 0 {
		t.Fatal("old material not kept")
	}
	// Valid: a new intermediate under the same root. The watcher picks it up and
	// announces it once the reload delay has passed on its clock. (A new root must
	// come cross-signed: TestPluggedRootSwapThatWouldStrandTheFleet.)
	inter2 = testkit.NewCA(t, "inter2", root, t0, 12*time.Hour)
	root2 = testkit.NewCA(t, "root2", nil, t0, 48*time.Hour) // in the bundle beside the current root
	signertest.WriteCACerts(t, dir, inter2, []*x509.Certificate{root.Cert}, root2.Cert, root.Cert)
	testkit.EventuallyWithin(t, 30*time.Second, "reload", func() bool {
		fake.Add(20 * time.Millisecond) // the watcher's delay after the last change seen
		return auth.Current().Cert.Equal(inter2.Cert)
	})
	testkit.EventuallyWithin(t, 30*time.Second, "trust.changed", func() bool { return len(rec.all()) == 1 })
	tc := rec.all()[0]
	if tc.Reason != events.TrustReasonReload || len(tc.Roots) != 2 || len(tc.Added) != 1 || tc.Added[0] != pki.Fingerprint(root2.Cert) || tc.Generation <= first.Generation {
		t.Fatalf("trust.changed %+v", tc)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
