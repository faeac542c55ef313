package identity

// The CA flow's request: the key, the CSR and the credential that proves the pod.

import (
	"context"
	"crypto"
	"crypto/tls"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// newKey makes the key and CSR of one renewal. Every attempt of the renewal sends
// the same CSR: when an attempt's answer is lost (it timed out as the signer
// answered), the signer answers the next one with the certificate it already
// recorded for that CSR instead of signing a second one. The key stays in this
// process until a certificate for it is installed.
func (m *Manager) newKey() (crypto.Signer, []byte, error) {
	key, err := pki.GenerateKey(m.cfg.KeyAlg)
	if err != nil {
		return nil, nil, err
	}
	csrPEM, err := pki.NewCSR(key, m.cfg.SPIFFEID)
	if err != nil {
		return nil, nil, err
	}
	return key, csrPEM, nil
}

// issueOnce makes one signing attempt for key's CSR; on success commit installs the
// result. The request it sends (events.SignRequest) is the one the signer's issuer
// reads.
func (m *Manager) issueOnce(ctx context.Context, key crypto.Signer, csrPEM []byte, timeout time.Duration) (commit func(), err error) {
	req := events.SignRequest{CSR: string(csrPEM), TTL: m.cfg.TTL, Pod: m.cfg.Pod, Resource: secrets.Default, KeyAlgorithm: string(m.cfg.KeyAlg), CertSigner: m.cfg.CertSigner}
	if err := m.credential(&req, csrPEM); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	resp, err := m.signer.Sign(rctx, req)
	cancel()
	if err != nil {
		return nil, err
	}
	c, err := m.checkReply(resp, key)
	if err != nil {
		return nil, err
	}
	keyPEM, err := pki.EncodeKeyPEM(key, m.cfg.PKCS8)
	if err != nil {
		return nil, err
	}
	return func() {
		m.mu.Lock()
		m.key, m.keyPEM, m.chain, m.chainPEM, m.got = key, keyPEM, c.chain, resp.ChainPEM, m.clock.Now()
		signerChanged := m.trust.setSigner(c.signer)
		m.mu.Unlock()
		if signerChanged && len(c.signer) > 0 {
			m.log.Info("named signer's roots endorsed by the mesh CA", "signer", m.cfg.CertSigner, "roots", fingerprints(c.signer))
		}
		// A new root in the reply is a trust change, like trust.changed.
		rootsChanged := m.apply(c.update) || signerChanged
		if m.trust.ca.AddCertified(c.certified) {
			m.log.Info("new root learned from a sign reply: its key is certified under a trusted root", "roots", fingerprints(c.certified))
			rootsChanged = true
		}
		m.publish(true, rootsChanged || !m.has(secrets.RootCA))
	}, nil
}

// credential fills a fresh token from the token file; when it cannot be read, a
// still-valid certificate proves who we are instead (CertChain + Proof): our own,
// else the provisioned one.
func (m *Manager) credential(req *events.SignRequest, csrPEM []byte) error {
	tok, terr := os.ReadFile(m.cfg.TokenFile)
	if terr == nil && len(strings.TrimSpace(string(tok))) > 0 {
		req.Token = strings.TrimSpace(string(tok))
		return nil
	}
	if terr == nil {
		terr = errors.New("token file is empty")
	}
	m.mu.Lock()
	key, chain, chainPEM := m.key, m.chain, m.chainPEM
	m.mu.Unlock()
	if key == nil || m.clock.Now().After(chain[0].NotAfter) {
		if m.cfg.Provisioned == nil {
			return fmt.Errorf("read token %s: %w", m.cfg.TokenFile, terr)
		}
		prov, err := m.cfg.Provisioned()
		if err != nil {
			return fmt.Errorf("read token %s: %w; and no valid certificate: %w", m.cfg.TokenFile, terr, err)
		}
		signer, ok := prov.PrivateKey.(crypto.Signer)
		if !ok {
			return fmt.Errorf("provisioned key is a %T, not a signing key", prov.PrivateKey)
		}
		key, chainPEM = signer, nil
		for _, der := range prov.Certificate {
			chainPEM = append(chainPEM, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
		}
		m.log.Warn("token unreadable and no valid certificate, renewing with the provisioned certificate", "error", terr)
	} else {
		m.log.Warn("token unreadable, renewing with the current certificate", "error", terr)
	}
	b, _ := pem.Decode(csrPEM)
	proof, err := pki.SignProof(key, b.Bytes)
	if err != nil {
		return err
	}
	req.CertChain, req.Proof = chainPEM, base64.StdEncoding.EncodeToString(proof)
	return nil
}

// ClientCertificate is the current certificate with its key, for renewal by
// certificate over mTLS (the key stays in this process); an error when there is none
// or it has expired.
func (m *Manager) ClientCertificate() (*tls.Certificate, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.key == nil {
		return nil, errors.New("no certificate yet")
	}
	if now := m.clock.Now(); now.After(m.chain[0].NotAfter) {
		return nil, fmt.Errorf("the current certificate expired at %s", m.chain[0].NotAfter.Format(time.RFC3339))
	}
	c := &tls.Certificate{PrivateKey: m.key, Leaf: m.chain[0]}
	for _, x := range m.chain {
		if x.IsCA && x.CheckSignatureFrom(x) == nil {
			continue // the root: the CA has it
		}
		c.Certificate = append(c.Certificate, x.Raw)
	}
	return c, nil
}
