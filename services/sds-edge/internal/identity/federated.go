package identity

import (
	"fmt"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// Federated applies a foreign trust domain's bundle from trust.federated: taken
// only when the pod's own CA endorsed it (trustbundle.Foreign), and then the
// SPIFFE validation context (ROOTCA_SPIFFE) is pushed. A refused event changes
// nothing.
func (m *Manager) Federated(ev events.TrustFederated) error {
	if !m.trust.ca.Bootstrapped() {
		return fmt.Errorf("trust.federated for %q before the first trust bundle", ev.Foreign)
	}
	m.mu.Lock()
	if m.foreign == nil {
		m.foreign = trustbundle.NewForeign(m.trust.ca)
	}
	f := m.foreign
	m.mu.Unlock()
	changed, err := f.Apply(ev)
	if err != nil {
		m.obs.TrustRejected("trust.federated")
		return err
	}
	if changed {
		m.log.Info("foreign trust domain", "trust_domain", ev.Foreign, "roots", len(ev.Roots), "removed", ev.Removed, "source", ev.Source)
		m.publish(false, true)
	}
	return nil
}

// publishSPIFFE stores ROOTCA_SPIFFE: home roots (rootsPEM) under our trust
// domain and each of its aliases, each followed domain's roots under its own name.
func (m *Manager) publishSPIFFE(rootsPEM []byte) {
	if m.cfg.TrustDomain == "" {
		return
	}
	bundles := map[string][]byte{m.cfg.TrustDomain: rootsPEM}
	m.mu.Lock()
	f := m.foreign
	m.mu.Unlock()
	if f != nil {
		for _, d := range f.Domains() {
			bundles[d.TrustDomain] = pki.EncodeCertsPEM(d.Roots)
		}
	}
	sec, err := secrets.SPIFFEValidation(secrets.WithAliases(bundles, m.cfg.TrustDomain, m.cfg.TrustDomainAliases))
	if err != nil {
		m.log.Error("cannot build the SPIFFE validation context", "error", err)
		return
	}
	m.obs.Changed(m.store.Set(sec))
}
