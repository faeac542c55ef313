package cli

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/busrpc"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// csrOverBus renews by certificate over the bus, as a VM with no token does: it
// connects presenting -cert over TLS (the signer's auth callout admits it as the
// pod the certificate was issued to, -pod), then asks for a certificate for a new
// key on the identity subject the callout granted, else on the pod subject with
// the certificate and a proof of its key. It returns the new key and chain.
func csrOverBus(ctx context.Context, f csrFlags, natsURL, caFile string) (crypto.Signer, []*x509.Certificate, error) {
	held, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("-cert/-key: %w", err)
	}
	leaf, err := x509.ParseCertificate(held.Certificate[0])
	if err != nil {
		return nil, nil, fmt.Errorf("-cert: %w", err)
	}
	heldKey, ok := held.PrivateKey.(crypto.Signer)
	if !ok || len(leaf.URIs) != 1 {
		return nil, nil, errors.New("-cert: want a workload certificate with one SPIFFE ID and its signing key")
	}
	_, ns, sa, err := pki.ParseWorkloadID(leaf.URIs[0].String())
	if err != nil {
		return nil, nil, fmt.Errorf("-cert: %w", err)
	}
	pod, err := parsePod(f.pod)
	if err != nil {
		return nil, nil, fmt.Errorf("-pod: %w", err)
	}
	if pod.Namespace != ns {
		return nil, nil, fmt.Errorf("-pod: %s is not in the namespace of -cert's identity (%s)", pod, leaf.URIs[0])
	}
	nc, err := bus.Connect(ctx, bus.Config{URL: natsURL, Name: "meshctl csr", Pod: pod.String(), InboxPrefix: policy.Inbox(policy.Pod, pod),
		TLS: bus.TLSConfig{CAFile: caFile, ClientCert: func() (*tls.Certificate, error) { return &held, nil }}, ConnectWait: 2 * time.Second}, hclog.NewNullLogger())
	if err != nil {
		return nil, nil, fmt.Errorf("%w (the bus must speak TLS and ask for client certificates, and -cert must have been issued to pod %s)", err, pod)
	}
	defer nc.Close()
	alg, key, csr, err := newKeyCSR(f.alg, leaf.URIs[0].String())
	if err != nil {
		return nil, nil, err
	}
	parsed, err := pki.ParseCSR(csr)
	if err != nil {
		return nil, nil, err
	}
	sig, err := pki.SignProof(heldKey, parsed.Raw)
	if err != nil {
		return nil, nil, err
	}
	var chain []*x509.Certificate
	for _, der := range held.Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, nil, fmt.Errorf("-cert: %w", err)
		}
		chain = append(chain, c)
	}
	req := events.SignRequest{CSR: string(csr), TTL: f.ttl, Pod: pod, KeyAlgorithm: string(alg),
		CertChain: pki.CertPEMs(chain), Proof: base64.StdEncoding.EncodeToString(sig)}
	// The identity subject the callout granted: the signer proves the request by
	// the certificate the connection was admitted with and the proof over the CSR.
	idSubject, err := events.IdentitySignSubject(pod, sa)
	if err != nil {
		return nil, nil, err
	}
	rep, err := busrpc.Sign(ctx, nc, idSubject, req, "sign over the bus")
	if err != nil {
		return nil, nil, err
	}
	if rep.Error != nil {
		return nil, nil, fmt.Errorf("signer refused: %w", rep.Error)
	}
	certs, err := pki.ParseCertPEMs(rep.CertChain)
	if err != nil || len(certs) == 0 {
		return nil, nil, fmt.Errorf("reply chain: %v", err)
	}
	return key, certs, nil
}
