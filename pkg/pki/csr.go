package pki

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// WorkloadID builds spiffe://<td>/ns/<ns>/sa/<sa>, checking each part with go-spiffe
// (which knows the SPIFFE ID grammar so that we do not hand-roll it).
func WorkloadID(trustDomain, ns, sa string) (spiffeid.ID, error) {
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("trust domain %q: %w", trustDomain, err)
	}
	if ns == "" || sa == "" {
		return spiffeid.ID{}, errors.New("namespace and service account are required")
	}
	id, err := spiffeid.FromSegments(td, "ns", ns, "sa", sa)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("spiffe id for ns %q sa %q: %w", ns, sa, err)
	}
	return id, nil
}

// ParseWorkloadID splits a spiffe://<td>/ns/<ns>/sa/<sa> ID into its parts.
func ParseWorkloadID(s string) (td, ns, sa string, err error) {
	id, err := spiffeid.FromString(s)
	if err != nil {
		return "", "", "", fmt.Errorf("spiffe id %q: %w", s, err)
	}
	parts := strings.Split(strings.TrimPrefix(id.Path(), "/"), "/")
	if len(parts) != 4 || parts[0] != "ns" || parts[2] != "sa" {
		return "", "", "", fmt.Errorf("spiffe id %q: want path /ns/<ns>/sa/<sa>", s)
	}
	return id.TrustDomain().Name(), parts[1], parts[3], nil
}

// NewCSR makes a PEM CSR for id signed by key, with id as its only URI SAN, the way
// Istio's agent asks. The signer ignores what a CSR asks for except its public key;
// the SAN is there for CAs that read it.
func NewCSR(key crypto.Signer, id string) ([]byte, error) {
	u, err := url.Parse(id)
	if err != nil {
		return nil, fmt.Errorf("csr: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{u}}, key)
	if err != nil {
		return nil, fmt.Errorf("csr: %w", err)
	}
	return encodePEM("CERTIFICATE REQUEST", der), nil
}

// ParseCSR parses exactly one PEM CSR and verifies its self-signature.
func ParseCSR(data []byte) (*x509.CertificateRequest, error) {
	b, rest := pem.Decode(data)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("csr: no CERTIFICATE REQUEST PEM block")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("csr: trailing data after the CSR")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("csr: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("csr: signature does not verify: %w", err)
	}
	return csr, nil
}
