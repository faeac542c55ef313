package kubecsr

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
)

// oidSAN is the subjectAltName extension, the only one a workload CSR may carry.
var oidSAN = asn1.ObjectIdentifier{2, 5, 29, 17}

// CheckCSR checks that csr asks for nothing but id, as istiod's RA does
// (ra.ValidateCSR): an external signer copies the CSR's subject and names into
// the certificate, so a CSR naming anything else would get it. One URI SAN, id;
// no DNS name, IP or email; no extension but the SANs; an empty subject, or an
// empty organization as Istio's agent writes it.
func CheckCSR(csr *x509.CertificateRequest, id *url.URL) error {
	if len(csr.URIs) != 1 || csr.URIs[0].String() != id.String() {
		return fmt.Errorf("csr asks for %v, not %s: an external signer signs what the CSR names, so it must name exactly the caller's identity", csr.URIs, id)
	}
	if len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses) > 0 {
		return errors.New("csr asks for DNS names, IPs or emails: an external signer would certify them")
	}
	for _, e := range csr.Extensions {
		if !e.Id.Equal(oidSAN) {
			return fmt.Errorf("csr carries extension %s: only subjectAltName is allowed", e.Id)
		}
	}
	if !slices.ContainsFunc(emptySubjects, func(s []byte) bool { return bytes.Equal(s, csr.RawSubject) }) {
		return fmt.Errorf("csr has subject %q: an external signer would copy it; want an empty subject", csr.Subject.String())
	}
	return nil
}

// emptySubjects are the subjects a workload CSR may have, DER: none (meshagent's
// pods, Istio's ztunnel) and an empty organization (Istio's agent).
var emptySubjects = func() [][]byte {
	var out [][]byte
	for _, n := range []pkix.Name{{}, {Organization: []string{""}}} {
		der, err := asn1.Marshal(n.ToRDNSequence())
		if err != nil {
			panic(err)
		}
		out = append(out, der)
	}
	return out
}()

// CheckLeaf checks what the external signer wrote for csr: a PEM chain whose
// first certificate is no CA, certifies csr's key for exactly id, and verifies
// at now through the rest to one of roots. It returns the leaf and the chain Go
// built above it (intermediates, then the root).
func CheckLeaf(chainPEM []byte, csr *x509.CertificateRequest, id *url.URL, roots []*x509.Certificate, now time.Time) (*x509.Certificate, []*x509.Certificate, error) {
	certs, err := pki.ParseCertsPEM(chainPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("the external signer's certificate: %w", err)
	}
	leaf := certs[0]
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if pub, ok := leaf.PublicKey.(equaler); !ok || !pub.Equal(csr.PublicKey) {
		return nil, nil, errors.New("the external signer's certificate is not for the CSR's key")
	}
	if leaf.IsCA {
		return nil, nil, errors.New("the external signer's certificate is a CA")
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() || len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) > 0 {
		return nil, nil, fmt.Errorf("the external signer's certificate names %v %v %v %v, not exactly %s", leaf.URIs, leaf.DNSNames, leaf.IPAddresses, leaf.EmailAddresses, id)
	}
	rp, ip := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		rp.AddCert(r)
	}
	for _, c := range certs[1:] {
		ip.AddCert(c)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{Roots: rp, Intermediates: ip, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return nil, nil, fmt.Errorf("the external signer's certificate does not verify to its configured roots: %w", err)
	}
	return leaf, chains[0][1:], nil
}
