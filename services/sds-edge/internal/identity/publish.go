package identity

// What the CA flow publishes: the secrets it stores and the roots it keeps.

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/meshagent/meshagent/pkg/atomicfile"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

func (m *Manager) has(name string) bool { _, ok := m.store.Get(name); return ok }

// publish stores `default` and/or `ROOTCA` and writes the files (OUTPUT_CERTS) as
// one set, one publish after the other. Before the first bundle the files' roots
// are the ones the pod trusted before the restart (rootsBeforeBundle, which adopt
// serves as ROOTCA too): root-cert.pem is never written empty.
func (m *Manager) publish(cert, roots bool) {
	m.publishing.Lock()
	defer m.publishing.Unlock()
	now := m.clock.Now()
	m.mu.Lock()
	rootsPEM := m.trust.pem(now)
	keyPEM := m.keyPEM
	chainPEM := []byte(strings.Join(trimAll(m.chainPEM), "\n") + "\n")
	haveCert := m.key != nil
	m.mu.Unlock()
	if roots && len(rootsPEM) > 0 {
		m.set(sdsclient.Secret{Name: secrets.RootCA, TrustedCA: rootsPEM})
		m.publishSPIFFE(rootsPEM)
		m.keepTrust()
	}
	if cert && haveCert {
		m.set(sdsclient.Secret{Name: secrets.Default, CertChain: chainPEM, PrivateKey: keyPEM})
		m.keepCert(keyPEM, chainPEM)
	}
	filesRoots := rootsPEM
	if len(filesRoots) == 0 {
		filesRoots = pki.EncodeCertsPEM(m.rootsBeforeBundle())
	}
	if haveCert && len(filesRoots) > 0 {
		m.obs.Files(keyPEM, chainPEM, filesRoots)
	}
}

// keepTrust writes the CA roots trusted now to TrustState (not the relay's extra
// anchors, which are not trusted to vouch for the CA).
func (m *Manager) keepTrust() {
	roots := m.trust.ca.Roots()
	if m.cfg.TrustState == "" || len(roots) == 0 {
		return
	}
	if err := os.MkdirAll(filepath.Dir(m.cfg.TrustState), 0o700); err != nil {
		m.log.Warn("cannot keep the trusted roots across restarts", "path", m.cfg.TrustState, "error", err)
		return
	}
	if err := atomicfile.Write(m.cfg.TrustState, pki.EncodeCertsPEM(roots), 0o600); err != nil {
		m.log.Warn("cannot keep the trusted roots across restarts", "path", m.cfg.TrustState, "error", err)
	}
}

func (m *Manager) set(s sdsclient.Secret) {
	m.obs.Changed(m.store.Set(s))
}

func trimAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strings.TrimSpace(s)
	}
	return out
}
