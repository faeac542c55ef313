package composesecrets

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

var servers = []string{"nats-1", "nats-2"}

func config(t *testing.T) Config {
	root := t.TempDir()
	return Config{State: filepath.Join(root, "state"), Out: filepath.Join(root, "out"), Servers: servers,
		TLSLife: 24 * time.Hour, Now: time.Now()}
}

// listing is name -> mode of the files in dir.
func listing(t *testing.T, dir string) map[string]os.FileMode {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]os.FileMode{}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = fi.Mode().Perm()
	}
	return m
}

// Each holder gets exactly its own credential, secrets owner-only.
func TestEachHolderGetsOnlyItsOwn(t *testing.T) {
	c := config(t)
	if err := Write(c); err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]os.FileMode{
		SignerDir:    {"signer.nk": 0o600, "callout.nk": 0o600, "callout-issuer.nk": 0o600, KEKFile: 0o600, "ca.pem": 0o644},
		RotatorDir:   {"rotator.nk": 0o600, "ca.pem": 0o644},
		InventoryDir: {"inventory.nk": 0o600, "ca.pem": 0o644},
		PodDir:       {"ca.pem": 0o644},
		HostDir:      {"admin.nk": 0o600, "audit.nk": 0o600, "ca.pem": 0o644},
		KubeletDir:   {filepath.Base(devtoken.KeyPath("")): 0o600, filepath.Base(devtoken.JWKSPath("")): 0o644},
		JWKSDir:      {filepath.Base(devtoken.JWKSPath("")): 0o644},
		"nats-1":     {AuthConf: 0o644, ServerCert: 0o644, ServerKey: 0o600, "ca.pem": 0o644},
		"nats-2":     {AuthConf: 0o644, ServerCert: 0o644, ServerKey: 0o600, "ca.pem": 0o644},
	}
	ents, _ := os.ReadDir(c.Out)
	if len(ents) != len(want) {
		t.Fatalf("%d holder directories, want %d", len(ents), len(want))
	}
	for holder, files := range want {
		got := listing(t, filepath.Join(c.Out, holder))
		if len(got) != len(files) {
			t.Errorf("%s holds %v, want %v", holder, got, files)
		}
		for f, mode := range files {
			if got[f] != mode {
				t.Errorf("%s/%s: mode %v, want %v (present: %v)", holder, f, got[f], mode, got)
			}
		}
	}
	// The seeds are the right kinds of keys, and the KEK is 32 bytes.
	for _, f := range []struct {
		path string
		kind nkeys.PrefixByte
	}{
		{filepath.Join(c.Out, SignerDir, "signer.nk"), nkeys.PrefixByteUser},
		{filepath.Join(c.Out, SignerDir, "callout-issuer.nk"), nkeys.PrefixByteAccount},
		{filepath.Join(c.Out, HostDir, "audit.nk"), nkeys.PrefixByteUser},
	} {
		if _, err := policy.ReadSeed(f.path, f.kind); err != nil {
			t.Error(err)
		}
	}
	if kek, _ := os.ReadFile(filepath.Join(c.Out, SignerDir, KEKFile)); len(kek) != 32 {
		t.Errorf("kek: %d bytes", len(kek))
	}
	// A server's certificate is for its name, from the CA everyone else holds.
	ca, _ := os.ReadFile(filepath.Join(c.Out, PodDir, "ca.pem"))
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatal("pod ca.pem holds no certificate")
	}
	for _, s := range servers {
		pemCert, _ := os.ReadFile(filepath.Join(c.Out, s, ServerCert))
		certs, err := pki.ParseCertsPEM(pemCert)
		if err != nil || len(certs) != 1 {
			t.Fatalf("%s cert: %v", s, err)
		}
		if _, err := certs[0].Verify(x509.VerifyOptions{DNSName: s, Roots: pool,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s cert: %v", s, err)
		}
	}
	// The auth config is nats-server's, with the keys of these seeds.
	opts, err := server.ProcessConfigFile(filepath.Join(c.Out, "nats-1", AuthConf))
	if err != nil {
		t.Fatalf("nats-server rejects %s: %v", AuthConf, err)
	}
	kp, _ := policy.ReadSeed(filepath.Join(c.Out, RotatorDir, "rotator.nk"), nkeys.PrefixByteUser)
	pub, _ := kp.PublicKey()
	if !slices.ContainsFunc(opts.Nkeys, func(u *server.NkeyUser) bool { return u.Nkey == pub }) {
		t.Error("the rotator's seed is not a user of the auth config")
	}
}

// A second run (every docker-compose up) keeps every seed, the KEK and the bus CA,
// so the stack's state stays readable and the host's admin seed keeps working.
func TestSecondRunKeepsTheSecrets(t *testing.T) {
	c := config(t)
	if err := Write(c); err != nil {
		t.Fatal(err)
	}
	kept := []string{SignerDir + "/signer.nk", SignerDir + "/" + KEKFile, SignerDir + "/callout-issuer.nk",
		HostDir + "/admin.nk", PodDir + "/ca.pem", "nats-2/" + AuthConf, KubeletDir + "/" + filepath.Base(devtoken.KeyPath("")),
		JWKSDir + "/" + filepath.Base(devtoken.JWKSPath(""))}
	before := map[string][]byte{}
	for _, f := range kept {
		before[f], _ = os.ReadFile(filepath.Join(c.Out, f))
	}
	oldCert, _ := os.ReadFile(filepath.Join(c.Out, "nats-1", ServerCert))
	if err := Write(c); err != nil {
		t.Fatal(err)
	}
	for _, f := range kept {
		if now, _ := os.ReadFile(filepath.Join(c.Out, f)); len(now) == 0 || !bytes.Equal(now, before[f]) {
			t.Errorf("%s changed on the second run", f)
		}
	}
	if now, _ := os.ReadFile(filepath.Join(c.Out, "nats-1", ServerCert)); bytes.Equal(now, oldCert) {
		t.Error("server certificate not reissued")
	}
}

func TestBadConfigWritesNothing(t *testing.T) {
	c := config(t)
	for name, mod := range map[string]func(*Config){
		"no state":       func(c *Config) { c.State = "" },
		"no out":         func(c *Config) { c.Out = "" },
		"no servers":     func(c *Config) { c.Servers = nil },
		"holder name":    func(c *Config) { c.Servers = []string{"nats-1", "signer"} },
		"jwks name":      func(c *Config) { c.Servers = []string{"jwks"} },
		"short tls life": func(c *Config) { c.TLSLife = time.Minute },
		"state is out":   func(c *Config) { c.Out = c.State },
	} {
		t.Run(name, func(t *testing.T) {
			bad := c
			mod(&bad)
			err := Write(bad)
			if err == nil || !strings.Contains(err.Error(), "-") {
				t.Fatalf("got %v", err)
			}
			for _, d := range []string{c.State, c.Out} {
				if _, err := os.Stat(d); !os.IsNotExist(err) {
					t.Fatalf("%s made: %v", d, err)
				}
			}
		})
	}
}
