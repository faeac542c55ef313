package caclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	pb "istio.io/api/security/v1alpha1"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/trustbundle"
)

// Istio asks an Istio-compatible CA over gRPC (IstioCertificateService/
// CreateCertificate), as Istio's agent does with CA_ADDR: TLS verified against the
// configured roots, the token as "authorization: Bearer", and ClusterID metadata.
type Istio struct {
	addr      string
	clusterID string
	plaintext bool
	roots     func() *x509.CertPool // read at every dial, so a new bundle is used

	mu sync.Mutex
	cc *grpc.ClientConn
}

// NewIstio returns a client for addr. roots gives the pool to verify the CA's TLS
// certificate; plaintext disables TLS (Istio's port 15010).
func NewIstio(addr, clusterID string, plaintext bool, roots func() *x509.CertPool) *Istio {
	return &Istio{addr: addr, clusterID: clusterID, plaintext: plaintext, roots: roots}
}

func (c *Istio) conn() (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cc != nil {
		return c.cc, nil
	}
	var creds credentials.TransportCredentials
	if c.plaintext {
		creds = insecure.NewCredentials()
	} else {
		pool := c.roots()
		if pool == nil {
			return nil, errors.New("no roots to verify the ca's tls certificate: set -ca-root-cert")
		}
		creds = credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	}
	cc, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("dial ca %s: %w", c.addr, err)
	}
	c.cc = cc
	return cc, nil
}

// reset drops the connection so the next call dials again (with current roots).
func (c *Istio) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cc != nil {
		c.cc.Close()
		c.cc = nil
	}
}

// Close closes the connection.
func (c *Istio) Close() error { c.reset(); return nil }

// Sign calls CreateCertificate with req mapped onto Istio's request: the CSR, the
// TTL in seconds (ValidityDuration) and the token as metadata. Renewal by proof is
// not part of Istio's API: a request without a token is refused here.
func (c *Istio) Sign(ctx context.Context, req events.SignRequest) (Response, error) {
	if req.Token == "" {
		return Response{}, fmt.Errorf("%w: the gRPC CA needs a token", ErrRejected)
	}
	cc, err := c.conn()
	if err != nil {
		return Response{}, err
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+req.Token, "ClusterID", c.clusterID)
	resp, err := pb.NewIstioCertificateServiceClient(cc).CreateCertificate(ctx, &pb.IstioCertificateRequest{
		Csr: req.CSR, ValidityDuration: int64(req.TTL / time.Second),
	})
	if err != nil {
		c.reset()
		return Response{}, fmt.Errorf("create certificate: %w", err)
	}
	// Istio's reply carries the bundle only as the chain's last element, unendorsed.
	pems := resp.GetCertChain()
	if len(pems) == 0 {
		return Response{}, errors.New("create certificate: empty cert chain")
	}
	return Response{ChainPEM: pems, Bundle: trustbundle.Bundle{Roots: pems[len(pems)-1:]}}, nil
}
