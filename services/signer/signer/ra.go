package signer

import (
	"crypto/x509"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/signer/internal/kubecsr"
)

// newRA builds the registration authority (-external-ca): nil when the signer
// signs itself. The external signer's roots are read once, here.
func newRA(cfg Config, log hclog.Logger, clk clock.Clock) (*kubecsr.RA, error) {
	ra := cfg.RA
	if ra.ExternalCA == "" {
		return nil, nil
	}
	roots, err := kubecsr.LoadRoots(ra.RootsFile)
	if err != nil {
		return nil, err
	}
	c, err := kubecsr.New(kubecsr.Config{URL: ra.APIURL, CAFile: ra.CAFile, BearerFile: ra.BearerFile,
		SignerName: ra.Signer, Usages: ra.Usages, Timeout: ra.Timeout}, log, clk)
	if err != nil {
		return nil, err
	}
	log.Info("registration authority: leaves are signed through the CertificateSigningRequest API", "signer_name", ra.Signer, "api", ra.APIURL, "external_roots", len(roots))
	return kubecsr.NewRA(c, roots, log), nil
}

// externalRoots are the roots the trust bundle holds besides the mesh CA's: the
// external signer's, in registration-authority mode.
func (s *Signer) externalRoots() []*x509.Certificate {
	if s.ra == nil {
		return nil
	}
	return s.ra.Roots()
}
