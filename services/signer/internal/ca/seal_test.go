package ca

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/nats-io/nats.go/jetstream"
)

func TestLoadKEK(t *testing.T) {
	key := bytes.Repeat([]byte{0xa5}, 32)
	b64 := base64.StdEncoding.EncodeToString(key)
	tests := []struct {
		name    string
		data    []byte
		mode    os.FileMode
		dir     bool // the path is a directory
		missing bool
		wantErr string
	}{
		{name: "raw", data: key, mode: 0o600},
		{name: "raw read-only", data: key, mode: 0o400},
		{name: "base64 with newline", data: []byte(b64 + "\n"), mode: 0o600},
		{name: "base64url unpadded", data: []byte(base64.RawURLEncoding.EncodeToString(key)), mode: 0o600},
		{name: "missing", missing: true, wantErr: "no such file"},
		{name: "a directory", dir: true, wantErr: "not a regular file"},
		{name: "world readable", data: key, mode: 0o644, wantErr: "mode 0644: others may access it"},
		// A temp file's group is this process's: as a Kubernetes Secret under an fsGroup.
		{name: "readable by this process's group", data: key, mode: 0o440},
		{name: "group writable", data: key, mode: 0o620, wantErr: "mode 0620"},
		{name: "empty", data: nil, mode: 0o600, wantErr: "want 32 random bytes"},
		{name: "31 raw bytes", data: key[:31], mode: 0o600, wantErr: "want 32 random bytes"},
		{name: "base64 of 16 bytes", data: []byte(base64.StdEncoding.EncodeToString(key[:16])), mode: 0o600, wantErr: "want 32 random bytes"},
		{name: "too large", data: bytes.Repeat([]byte("A"), 4096), mode: 0o600, wantErr: "larger than"},
		{name: "all zero", data: make([]byte, 32), mode: 0o600, wantErr: "all zero"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "ca-kek")
			switch {
			case tt.dir:
				if err := os.Mkdir(p, 0o700); err != nil {
					t.Fatal(err)
				}
			case !tt.missing:
				if err := os.WriteFile(p, tt.data, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(p, tt.mode); err != nil {
					t.Fatal(err)
				}
			}
			k, err := LoadKEK(p)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "-ca-kek-file") {
					t.Fatalf("err = %v, want %q naming -ca-kek-file", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// The same 32 bytes whichever way they were written.
			sk, err := mustKEK(key).seal("cluster.local", mustKey(t))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := k.open("cluster.local", sk); err != nil {
				t.Fatalf("KEK read from %s does not open what the same bytes sealed: %v", tt.name, err)
			}
		})
	}
}

func mustKey(t *testing.T) crypto.Signer {
	t.Helper()
	k, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// A sealed key opens only in its own record: another trust domain, another key id or
// another KEK is refused.
func TestSealedKeyIsBoundToItsRecord(t *testing.T) {
	k1, k2 := mustKey(t), mustKey(t)
	s1, err := testKEK.seal("cluster.local", k1)
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := testKEK.seal("cluster.local", k2)
	swapped := s1
	swapped.KeyID = s2.KeyID
	other := mustKEK(bytes.Repeat([]byte{7}, 32))
	for name, try := range map[string]func() (crypto.Signer, error){
		"other trust domain": func() (crypto.Signer, error) { return testKEK.open("example.org", s1) },
		"other key id":       func() (crypto.Signer, error) { return testKEK.open("cluster.local", swapped) },
		"other KEK":          func() (crypto.Signer, error) { return other.open("cluster.local", s1) },
	} {
		if _, err := try(); !errors.Is(err, ErrUnseal) {
			t.Errorf("%s: err = %v, want ErrUnseal", name, err)
		}
	}
	got, err := testKEK.open("cluster.local", s1)
	if err != nil || !got.Public().(*ecdsa.PublicKey).Equal(k1.Public()) {
		t.Fatalf("own record: %v", err)
	}
}

// kvValue is the raw stored root.
func kvValue(t *testing.T, js jetstream.JetStream) jetstream.KeyValueEntry {
	t.Helper()
	kv, err := js.KeyValue(context.Background(), "meshagent-ca")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(context.Background(), RootKey)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// assertNoClearKey fails when value holds key in any encoding a reader could use.
func assertNoClearKey(t *testing.T, value []byte, key crypto.Signer) {
	t.Helper()
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	needles := map[string][]byte{"PRIVATE KEY": []byte("PRIVATE KEY"), "PKCS#8 DER": pkcs8}
	if ec, ok := key.(*ecdsa.PrivateKey); ok {
		sec1, _ := x509.MarshalECPrivateKey(ec)
		needles["SEC1 DER"] = sec1
		d, _ := ec.Bytes()
		needles["scalar"] = d
	}
	for name, pkcs8 := range map[string]bool{"PKCS#8 PEM": true, "PEM": false} {
		needles[name], _ = pki.EncodeKeyPEM(key, pkcs8)
	}
	for name, n := range needles {
		for enc, b := range map[string][]byte{"raw": n, "base64": []byte(base64.StdEncoding.EncodeToString(n))} {
			if len(b) > 0 && bytes.Contains(value, b) {
				t.Fatalf("kv value holds the key (%s, %s)", name, enc)
			}
		}
	}
}

func TestKVNeverHoldsTheKeyInClear(t *testing.T) {
	s := bustest.Server(t)
	fake := clock.NewFake(t0)
	js := bustest.JetStream(t, bustest.Conn(t, s))
	r := newReplica(t, js, fake)
	ctx := context.Background()
	if err := r.src.Start(ctx); err != nil {
		t.Fatal(err)
	}
	first := r.auth.Current()
	assertNoClearKey(t, kvValue(t, js).Value(), first.Key)
	m, err := r.src.Rotate(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	v := kvValue(t, js).Value()
	assertNoClearKey(t, v, first.Key) // still kept, sealed, to endorse for the old root
	assertNoClearKey(t, v, m.Key)
	var st stored
	if err := json.Unmarshal(v, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Keys) != 2 || st.TrustDomain != "cluster.local" {
		t.Fatalf("stored: %d sealed keys, trust domain %q", len(st.Keys), st.TrustDomain)
	}
	if strings.Contains(string(v), `"key_pem"`) {
		t.Fatal("stored value has a key_pem field")
	}
}

func TestWrongKEKRefusesAndWritesNothing(t *testing.T) {
	s := bustest.Server(t)
	fake := clock.NewFake(t0)
	a := newReplica(t, bustest.JetStream(t, bustest.Conn(t, s)), fake)
	if err := a.src.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	js := bustest.JetStream(t, bustest.Conn(t, s))
	before := kvValue(t, js)
	b := newReplica(t, js, fake)
	b.src.cfg.KEK = mustKEK(bytes.Repeat([]byte{9}, 32))
	err := b.src.Start(context.Background())
	if !errors.Is(err, ErrUnseal) || !strings.Contains(err.Error(), "cannot unseal CA key: wrong -ca-kek-file?") {
		t.Fatalf("start with the wrong KEK: %v", err)
	}
	if b.auth.Current() != nil || len(b.rec.all()) != 0 {
		t.Fatal("a replica with the wrong KEK loaded a root or announced")
	}
	if _, err := b.src.Rotate(context.Background(), true); !errors.Is(err, ErrUnseal) {
		t.Fatalf("rotate with the wrong KEK: %v", err)
	}
	if after := kvValue(t, js); after.Revision() != before.Revision() || !bytes.Equal(after.Value(), before.Value()) {
		t.Fatal("kv changed")
	}
}
