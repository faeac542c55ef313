package upstream

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

func ca(t *testing.T, cn string) *x509.Certificate {
	return testkit.NewCA(t, cn, nil, time.Now(), time.Hour).Cert
}

func subjects(d *Dialer) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	//lint:ignore SA1019 the pool is built from PEM files, never SystemCertPool, so Subjects is complete.
	return len(d.tls.RootCAs.Subjects())
}

func TestRootFileIsReReadOnTrustChange(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ca.pem")
	c1, c2 := ca(t, "one"), ca(t, "two")
	if err := os.WriteFile(file, pki.EncodeCertPEM(c1), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Address: "istiod:15012", Mode: TLS, RootCAFile: file, MaxMsgSize: 1 << 20, ConnectTimeout: time.Second}, nil, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cc, _, release, err := d.Dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if n := subjects(d); n != 1 || d.tls.ServerName != "istiod" {
		t.Fatalf("roots %d server name %q", n, d.tls.ServerName)
	}
	if err := os.WriteFile(file, pki.EncodeCertsPEM([]*x509.Certificate{c1, c2}), 0o600); err != nil {
		t.Fatal(err)
	}
	// With a pinned root file the event's roots are not added; the file is re-read.
	if err := d.TrustChanged(2, []*x509.Certificate{ca(t, "mesh")}); err != nil {
		t.Fatal(err)
	}
	if n := subjects(d); n != 2 {
		t.Fatalf("after reload: %d roots, want 2", n)
	}
	cc2, _, release2, err := d.Dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer release2()
	if cc2 == cc {
		t.Fatal("a rebuild must give new streams a new connection")
	}
	// A broken file fails the rebuild and keeps the last good configuration.
	if err := os.WriteFile(file, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.TrustChanged(3, nil); err == nil || !strings.Contains(err.Error(), "no PEM") {
		t.Fatalf("err = %v", err)
	}
	if n := subjects(d); n != 2 {
		t.Fatalf("after failed reload: %d roots, want 2", n)
	}
	// A stale generation changes nothing.
	if err := d.TrustChanged(1, nil); err != nil {
		t.Fatal(err)
	}
}

func TestNewRejectsMissingMaterial(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"mtls without sds", Config{Mode: MTLS, RootCAFile: "/x"}},
		{"tls without roots", Config{Mode: TLS}},
		{"unknown mode", Config{Mode: "quic"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg, nil, hclog.NewNullLogger()); err == nil {
				t.Fatal("want error")
			}
		})
	}
}

func TestMetadataTokenErrors(t *testing.T) {
	d, err := New(Config{Address: "x:1", Mode: Plaintext, TokenFile: filepath.Join(t.TempDir(), "missing")}, nil, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := d.Dial(t.Context()); err == nil || !strings.Contains(err.Error(), "read token") {
		t.Fatalf("err = %v", err)
	}
}
