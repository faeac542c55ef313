package caclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/pkg/xdswire"
)

// Istio asks an Istio-compatible CA over gRPC (IstioCertificateService/
// CreateCertificate), as Istio's agent does with CA_ADDR: TLS verified against the
// configured roots, the token as "authorization: Bearer", and ClusterID metadata.
type Istio struct {
	addr      string
	clusterID string
	plaintext bool
	roots     func() *x509.CertPool // read at every dial, so a new bundle is used
	// clientCert is the certificate presented for renewal by certificate (the
	// pod's current one, or PROV_CERT's); nil: never.
	clientCert func() (*tls.Certificate, error)

	mu sync.Mutex
	cc *grpc.ClientConn
}

// NewIstio returns a client for addr. roots gives the pool to verify the CA's TLS
// certificate; plaintext disables TLS (Istio's port 15010).
func NewIstio(addr, clusterID string, plaintext bool, roots func() *x509.CertPool) *Istio {
	return &Istio{addr: addr, clusterID: clusterID, plaintext: plaintext, roots: roots}
}

// SetClientCert makes the client renew over mTLS with the certificate f returns
// when a request has no token, or its token is refused (Istio's PROV_CERT and VM
// flow: the CA takes the identity from the certificate). Call before the first Sign.
func (c *Istio) SetClientCert(f func() (*tls.Certificate, error)) { c.clientCert = f }

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
// TTL in seconds (ValidityDuration), the named signer as Istio's agent names it
// (the request's metadata struct, field CertSigner) and the token as metadata. Without a token, or
// when the CA refuses it, the request goes over mTLS with the client certificate
// (SetClientCert) instead; Istio's API has no proof field, so the TLS handshake is
// the proof of the key.
func (c *Istio) Sign(ctx context.Context, req events.SignRequest) (Response, error) {
	if req.Token == "" && c.clientCert == nil {
		return Response{}, fmt.Errorf("%w: the gRPC CA needs a token or a client certificate", ErrRejected)
	}
	var resp *certificateResponse
	var err error
	if req.Token != "" {
		resp, err = c.create(ctx, req, nil)
		if status.Code(err) == codes.Unauthenticated && c.clientCert != nil {
			resp, err = c.byCert(ctx, req)
		}
	} else {
		resp, err = c.byCert(ctx, req)
	}
	if err != nil {
		if status.Code(err) == codes.Unavailable {
			return Response{}, fmt.Errorf("create certificate: %w: %w", ErrUnreachable, err)
		}
		return Response{}, fmt.Errorf("create certificate: %w", err)
	}
	// Istio's reply carries the bundle only as the chain's last element, unendorsed.
	pems := resp.CertChain
	if len(pems) == 0 {
		return Response{}, errors.New("create certificate: empty cert chain")
	}
	return Response{ChainPEM: pems, Bundle: trustbundle.Bundle{Roots: pems[len(pems)-1:]}, Signer: resp.signer, Vouched: resp.bundle}, nil
}

// create sends one CreateCertificate on cc, or on the shared connection when cc is
// nil, with the token as metadata when req has one.
func (c *Istio) create(ctx context.Context, req events.SignRequest, cc *grpc.ClientConn) (*certificateResponse, error) {
	shared := cc == nil
	if shared {
		var err error
		if cc, err = c.conn(); err != nil {
			return nil, err
		}
	}
	md := []string{"ClusterID", c.clusterID}
	if req.Token != "" {
		md = append(md, "authorization", "Bearer "+req.Token)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, md...)
	resp := &certificateResponse{}
	var header metadata.MD
	err := cc.Invoke(ctx, createCertificate, &certificateRequest{CSR: req.CSR, ValidityDuration: int64(req.TTL / time.Second), CertSigner: req.CertSigner},
		resp, grpc.ForceCodecV2(xdswire.Codec{}), grpc.Header(&header))
	if err != nil {
		if shared {
			c.reset()
		}
		return nil, err
	}
	if v := header.Get(events.SignerRootsHeader); len(v) > 0 {
		resp.signer = &events.SignerRoots{}
		if err := json.Unmarshal([]byte(v[0]), resp.signer); err != nil {
			return nil, fmt.Errorf("header %s: %w", events.SignerRootsHeader, err)
		}
	}
	if resp.bundle, err = vouchedBundle(header); err != nil {
		return nil, err
	}
	return resp, nil
}

// vouchedBundle reads the trust bundle header (events.TrustBundleHeader): nil
// without one; an error when it is not one bundle of valid PEM roots within
// events.MaxEventSize. Its endorsement is the caller's to check.
func vouchedBundle(header metadata.MD) (*trustbundle.Bundle, error) {
	v := header.Get(events.TrustBundleHeader)
	if len(v) == 0 {
		return nil, nil
	}
	var r events.BundleReply
	var err error
	switch {
	case len(v) > 1:
		err = fmt.Errorf("%d values", len(v))
	case len(v[0]) > events.MaxEventSize:
		err = fmt.Errorf("%d bytes, more than %d", len(v[0]), events.MaxEventSize)
	default:
		if err = json.Unmarshal([]byte(v[0]), &r); err == nil {
			err = r.Validate()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("header %s: %w", events.TrustBundleHeader, err)
	}
	b := trustbundle.FromBundleReply(r)
	b.Whole = true
	return &b, nil
}

// byCert sends req without a token over a connection of its own that presents the
// client certificate, closed after the one call: the next renewal presents the
// certificate current then, not the one this connection was made with.
func (c *Istio) byCert(ctx context.Context, req events.SignRequest) (*certificateResponse, error) {
	if c.plaintext {
		return nil, status.Error(codes.FailedPrecondition, "renewal by certificate needs TLS to the CA (not port 15010)")
	}
	cert, err := c.clientCert()
	if err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "no token and no client certificate: %v", err)
	}
	pool := c.roots()
	if pool == nil {
		return nil, errors.New("no roots to verify the ca's tls certificate: set -ca-root-cert")
	}
	cc, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil },
	})))
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "dial ca %s: %v", c.addr, err)
	}
	defer cc.Close()
	req.Token = ""
	return c.create(ctx, req, cc)
}
