package identity

// The CA flow's warm start: the certificate and key a previous run left
// (CertState, else OUTPUT_CERTS) are served again at once if they are still valid,
// are for this pod's identity, and chain to a root the pod trusted before.

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/meshagent/meshagent/pkg/atomicfile"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// restoreMargin is the least life a kept certificate must have left to be served
// again: one about to expire is not worth serving while a new one is asked for.
const restoreMargin = 2 * minSelfRenew

// restore serves the certificate and key a previous run left, if one of the places
// holds a usable pair, and reports whether it did. It runs before the first
// signing attempt, so a restarted sds-edge serves `default` without the CA.
func (m *Manager) restore() bool {
	var why []error
	for _, src := range m.keptSources() {
		keyPEM, chainPEMs, err := src.read()
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err == nil {
			err = m.adopt(keyPEM, chainPEMs)
		}
		if err != nil {
			why = append(why, fmt.Errorf("%s: %w", src.name, err))
			continue
		}
		m.log.Info("serving the certificate kept from before the restart", "from", src.name, "serial", m.Serial(), "not_after", m.Status().NotAfter)
		return true
	}
	if len(why) > 0 {
		m.log.Info("no kept certificate to serve: asking the CA", "error", errors.Join(why...))
	}
	return false
}

// keptSource is a place a previous run left a key and chain.
type keptSource struct {
	name string
	read func() (keyPEM []byte, chainPEMs []string, err error)
}

func (m *Manager) keptSources() []keptSource {
	var out []keptSource
	if p := m.cfg.CertState; p != "" {
		out = append(out, keptSource{name: p, read: func() ([]byte, []string, error) {
			b, err := os.ReadFile(p)
			if err != nil {
				return nil, nil, err
			}
			return splitKeyChain(b)
		}})
	}
	if d := m.cfg.OutputDir; d != "" {
		out = append(out, keptSource{name: d, read: func() ([]byte, []string, error) {
			key, err := os.ReadFile(filepath.Join(d, "key.pem"))
			if err != nil {
				return nil, nil, err
			}
			chain, err := os.ReadFile(filepath.Join(d, "cert-chain.pem"))
			if err != nil {
				return nil, nil, err
			}
			return splitKeyChain(append(append(key, '\n'), chain...))
		}})
	}
	return out
}

// splitKeyChain splits PEM data into its one private key and its certificates.
func splitKeyChain(b []byte) (keyPEM []byte, chain []string, err error) {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type == "CERTIFICATE" {
			chain = append(chain, string(pem.EncodeToMemory(blk)))
			continue
		}
		if keyPEM != nil {
			return nil, nil, errors.New("more than one private key")
		}
		keyPEM = pem.EncodeToMemory(blk)
	}
	if keyPEM == nil || len(chain) == 0 {
		return nil, nil, errors.New("not a private key and a certificate chain")
	}
	return keyPEM, chain, nil
}

// adopt takes keyPEM and chainPEMs as the current certificate if the chain is this
// pod's identity, for the key, valid for restoreMargin more, and verifies to a
// root the pod trusts (kept across the restart, or configured); then serves it.
func (m *Manager) adopt(keyPEM []byte, chainPEMs []string) error {
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		return fmt.Errorf("key: %w", err)
	}
	chain, err := checkChain(chainPEMs, m.cfg.SPIFFEID)
	if err != nil {
		return err
	}
	if !publicKeysEqual(chain[0].PublicKey, key.Public()) {
		return errors.New("the certificate is not for the key")
	}
	now := m.clock.Now()
	if left := chain[0].NotAfter.Sub(now); left < restoreMargin {
		return fmt.Errorf("the certificate has %s left", left.Round(1e6))
	}
	if err := m.trust.ca.VerifyChain(chain, m.cfg.Anchors, now); err != nil {
		return err
	}
	m.mu.Lock()
	m.key, m.keyPEM, m.chain, m.chainPEM = key, keyPEM, chain, chainPEMs
	m.got = time.Time{} // restored: renewals count from its NotBefore
	m.mu.Unlock()
	if roots := m.rootsBeforeBundle(); !m.has(secrets.RootCA) && len(roots) > 0 {
		// Before a bundle arrives, the roots the pod trusted before are its ROOTCA.
		m.set(sdsclient.Secret{Name: secrets.RootCA, TrustedCA: pki.EncodeCertsPEM(roots)})
	}
	m.publish(true, false)
	return nil
}

// keepCert writes the current key and chain to CertState (0600, in the pod's own
// directory), to be served again at once after a restart.
func (m *Manager) keepCert(keyPEM, chainPEM []byte) {
	if m.cfg.CertState == "" || len(keyPEM) == 0 {
		return
	}
	if err := os.MkdirAll(filepath.Dir(m.cfg.CertState), 0o700); err != nil {
		m.log.Warn("cannot keep the certificate across restarts", "path", m.cfg.CertState, "error", err)
		return
	}
	b := bytes.Join([][]byte{bytes.TrimSpace(keyPEM), bytes.TrimSpace(chainPEM)}, []byte("\n"))
	if err := atomicfile.Write(m.cfg.CertState, append(b, '\n'), 0o600); err != nil {
		m.log.Warn("cannot keep the certificate across restarts", "path", m.cfg.CertState, "error", err)
	}
}

// rootsBeforeBundle is what the pod serves as its roots before its first bundle:
// the roots it trusted before the restart (Kept), else its anchors.
func (m *Manager) rootsBeforeBundle() []*x509.Certificate {
	if len(m.cfg.Kept) > 0 {
		return m.cfg.Kept
	}
	return m.cfg.Anchors
}
