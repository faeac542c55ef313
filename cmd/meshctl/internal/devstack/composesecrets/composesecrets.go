// Package composesecrets makes the credentials of the docker compose stack and hands
// each container only its own: the bus credential set (pkg/bus/policy), the bus TLS
// material (bustls), the signers' CA key-encryption key and the dev token issuer's
// key (devtoken, the kubelet stand-in's) are generated once in a state directory and
// copied into one output directory per holder, which compose mounts as a separate
// volume (or, for the operator's credentials, a host directory). It is the compose
// stack's init container, meshctl compose-secrets.
package composesecrets

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/bustls"
	"github.com/meshagent/meshagent/pkg/atomicfile"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/devtoken"
)

// Holders other than the NATS servers: the directories under Config.Out.
const (
	SignerDir  = "signer"  // signer.nk, callout.nk, callout-issuer.nk, ca-kek, ca.pem
	RotatorDir = "rotator" // rotator.nk, ca.pem
	// InventoryDir is the operator service's: inventory.nk (its bus role), ca.pem.
	InventoryDir = "inventory"
	PodDir       = "pod"     // ca.pem: pods authenticate with their service-account token
	HostDir      = "host"    // admin.nk, audit.nk, ca.pem, owned by the directory's owner
	KubeletDir   = "kubelet" // the token issuer's key and JWKS (devtoken's -issuer-dir)
	JWKSDir      = "jwks"    // the JWKS alone: the signers verify tokens, they cannot mint them
)

// Names of the files a NATS server's directory holds (Config.Out/<server>), as the
// static nats.conf names them.
const (
	AuthConf   = "nats-auth.conf"
	ServerCert = "server-cert.pem"
	ServerKey  = "server-key.pem"
	KEKFile    = "ca-kek"
)

// Config says where the credentials are made and where they go.
type Config struct {
	State   string   // the generator's own directory: every seed, the bus CA key, the KEK
	Out     string   // parent of one directory per holder
	Servers []string // NATS server names (their hostnames on the compose network)
	TLSLife time.Duration
	Now     time.Time
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.State == "" {
		errs = append(errs, errors.New("-state: required"))
	}
	if c.Out == "" {
		errs = append(errs, errors.New("-out: required"))
	}
	if len(c.Servers) == 0 {
		errs = append(errs, errors.New("-servers: at least one"))
	}
	for _, s := range c.Servers {
		switch s {
		case SignerDir, RotatorDir, InventoryDir, PodDir, HostDir, KubeletDir, JWKSDir:
			errs = append(errs, fmt.Errorf("-servers: %q is a holder's directory, not a server name", s))
		}
	}
	if c.TLSLife < time.Hour {
		errs = append(errs, errors.New("-tls-life: at least 1h"))
	}
	if c.State != "" && c.Out != "" && filepath.Clean(c.State) == filepath.Clean(c.Out) {
		errs = append(errs, errors.New("-state and -out: must differ (the state holds every secret)"))
	}
	return errors.Join(errs...)
}

// Write makes what is missing in State (seeds, bus CA, KEK are reused; server
// certificates are issued anew) and copies each holder's part into its directory.
func Write(c Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	creds, err := policy.LoadOrGenerate(filepath.Join(c.State, "bus"))
	if err != nil {
		return err
	}
	conf, err := policy.Render(creds.Keys)
	if err != nil {
		return err
	}
	tlsDir := filepath.Join(c.State, "tls")
	if err := bustls.Write(tlsDir, c.Servers, c.TLSLife, c.Now); err != nil {
		return err
	}
	kek, err := devstack.CAKEK(c.State)
	if err != nil {
		return err
	}
	issuerDir := filepath.Join(c.State, "issuer")
	if _, err := devtoken.LoadOrCreate(issuerDir); err != nil {
		return err
	}
	jwks := src(devtoken.JWKSPath(issuerDir), 0o644)
	ca := src(filepath.Join(tlsDir, bustls.CAFile), 0o644)
	seed := func(r policy.Role) file { return src(creds.SeedFile(r), 0o600) }
	holders := map[string]map[string]file{
		SignerDir: {
			"signer.nk": seed(policy.Signer), "callout.nk": seed(policy.Callout),
			"callout-issuer.nk": src(creds.IssuerFile(), 0o600), KEKFile: src(kek, 0o600), bustls.CAFile: ca,
		},
		RotatorDir:   {"rotator.nk": seed(policy.Rotator), bustls.CAFile: ca},
		InventoryDir: {"inventory.nk": seed(policy.Inventory), bustls.CAFile: ca},
		PodDir:       {bustls.CAFile: ca},
		HostDir:      {"admin.nk": seed(policy.Admin), "audit.nk": seed(policy.Audit), bustls.CAFile: ca},
		KubeletDir: {
			filepath.Base(devtoken.KeyPath(issuerDir)):  src(devtoken.KeyPath(issuerDir), 0o600),
			filepath.Base(devtoken.JWKSPath(issuerDir)): jwks,
		},
		JWKSDir: {filepath.Base(devtoken.JWKSPath(issuerDir)): jwks},
	}
	for _, s := range c.Servers {
		holders[s] = map[string]file{
			AuthConf:      {data: []byte(conf), mode: 0o644},
			ServerCert:    src(filepath.Join(tlsDir, bustls.CertFile(s)), 0o644),
			ServerKey:     src(filepath.Join(tlsDir, bustls.KeyFile(s)), 0o600),
			bustls.CAFile: ca,
		}
	}
	for name, files := range holders {
		dir := filepath.Join(c.Out, name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("holder %s: %w", name, err)
		}
		owner := sameOwner
		if name == HostDir {
			// The operator's copy: readable by whoever made the directory, not only root.
			if owner, err = ownerOf(dir); err != nil {
				return fmt.Errorf("holder %s: %w", name, err)
			}
		}
		for fname, f := range files {
			if err := f.copyTo(filepath.Join(dir, fname), owner); err != nil {
				return fmt.Errorf("holder %s: %w", name, err)
			}
		}
	}
	return nil
}

// file is what one output file holds: a state file's content, or data.
type file struct {
	from string
	data []byte
	mode os.FileMode
}

func src(path string, mode os.FileMode) file { return file{from: path, mode: mode} }

// copyTo writes f to path atomically with f's mode (atomicfile), then gives it the
// owner chown gives.
func (f file) copyTo(path string, chown func(string) error) error {
	data := f.data
	if f.from != "" {
		var err error
		if data, err = os.ReadFile(f.from); err != nil {
			return err
		}
	}
	if err := atomicfile.Write(path, data, f.mode); err != nil {
		return err
	}
	return chown(path)
}

func sameOwner(string) error { return nil }
