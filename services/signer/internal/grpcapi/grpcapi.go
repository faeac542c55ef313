// Package grpcapi serves Istio's istio.v1.auth.IstioCertificateService/CreateCertificate
// over TLS, so that an Istio agent pointed at the signer with CA_ADDR gets
// certificates. The serving certificate is issued by the signer's own CA.
package grpcapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/grpcserve"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/issuer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"
)

// CertSignerKey is the request metadata field naming the signer (Istio's security.CertSigner).
const CertSignerKey = "CertSigner"

// ImpersonatedIdentityKey is the request metadata field naming the identity a
// trusted node agent asks for (Istio's security.ImpersonatedIdentity).
const ImpersonatedIdentityKey = "ImpersonatedIdentity"

// Server is the Istio CA gRPC server.
type Server struct {
	pb.UnimplementedIstioCertificateServiceServer

	addr  string
	iss   *issuer.Issuer
	certs *ServingCerts
	log   hclog.Logger

	mu    sync.Mutex
	ln    net.Addr
	bound chan struct{}

	bundle atomic.Pointer[encodedBundle] // the last trust bundle header encoded
}

var _ pb.IstioCertificateServiceServer = (*Server)(nil)

// New returns the server for addr: host:port, or unix:///path for a unix socket.
func New(addr string, iss *issuer.Issuer, certs *ServingCerts, log hclog.Logger) *Server {
	return &Server{addr: addr, iss: iss, certs: certs, log: log, bound: make(chan struct{})}
}

// Bound is closed once the listener is bound.
func (s *Server) Bound() <-chan struct{} { return s.bound }

// Addr is the bound address, or nil before Run binds.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ln
}

// Ready reports whether the listener is bound.
func (s *Server) Ready() error {
	if s.Addr() == nil {
		return errors.New("grpc not bound")
	}
	return nil
}

func listen(addr string) (net.Listener, error) {
	if p, ok := strings.CutPrefix(addr, "unix://"); ok {
		_ = os.Remove(p)
		return net.Listen("unix", p)
	}
	return net.Listen("tcp", addr)
}

// Run listens and serves until ctx is done, then stops gracefully within five seconds.
func (s *Server) Run(ctx context.Context) error {
	ln, err := listen(s.addr)
	if err != nil {
		return fmt.Errorf("listen grpc %s: %w", s.addr, err)
	}
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(s.certs.TLSConfig())),
		grpc.MaxRecvMsgSize(events.MaxEventSize),
	)
	pb.RegisterIstioCertificateServiceServer(srv, s)
	s.mu.Lock()
	s.ln = ln.Addr()
	s.mu.Unlock()
	close(s.bound)
	s.log.Info("grpc listening", "addr", ln.Addr().String(), "service", "istio.v1.auth.IstioCertificateService")
	return grpcserve.Serve(ctx, srv, ln, 5*time.Second)
}

// CreateCertificate signs the CSR for the caller authenticated by its bearer token
// (authorization metadata) or, without one, by its mTLS client certificate. Istio's
// request names no pod: cert.issued names the pod of a pod-bound token, else none.
func (s *Server) CreateCertificate(ctx context.Context, req *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	// Istio's request, on the one request type. ValidityDuration <= 0 asks for the
	// default, as in Istio's CA; one too large for a Duration is refused, not wrapped.
	ttl, err := events.TTLFromSeconds(max(req.GetValidityDuration(), 0))
	if err != nil {
		s.iss.Malformed(issuer.TransportGRPC, false)
		return nil, status.Errorf(codes.InvalidArgument, "validity_duration: %v", err)
	}
	r := events.SignRequest{
		CSR:        req.GetCsr(),
		TTL:        ttl,
		CertSigner: req.GetMetadata().GetFields()[CertSignerKey].GetStringValue(),
	}
	via := issuer.Via{Transport: issuer.TransportGRPC, Impersonate: req.GetMetadata().GetFields()[ImpersonatedIdentityKey].GetStringValue()}
	if auth := md.Get("authorization"); len(auth) > 0 {
		scheme, tok, ok := strings.Cut(auth[0], " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
			s.iss.AuthMalformed(issuer.TransportGRPC)
			return nil, status.Error(codes.Unauthenticated, "authorization metadata must be \"Bearer <token>\"")
		}
		r.Token = strings.TrimSpace(tok)
	} else if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			via.PeerChain = ti.State.PeerCertificates
		}
	}
	res, err := s.iss.Issue(ctx, r, via)
	if err != nil {
		return nil, toStatus(err)
	}
	s.setHeader(ctx, res, r.CertSigner)
	if cid := md.Get("ClusterID"); len(cid) > 0 {
		s.log.Trace("certificate issued", "cluster_id", cid[0], "serial", res.Leaf.SerialNumber.Text(16))
	}
	return &pb.IstioCertificateResponse{CertChain: res.Chain}, nil
}

// setHeader sends, in the response header, the trust bundle res was signed with,
// endorsed by the mesh CA (events.TrustBundleHeader: Istio's reply carries none,
// and sds-edge follows it as a bus pod follows the bundle of its sign reply), and
// for a named signer's leaf that signer's roots (events.SignerRootsHeader).
func (s *Server) setHeader(ctx context.Context, res issuer.Result, signer string) {
	md := metadata.MD{}
	if b, err := s.bundleHeader(res); err != nil {
		s.log.Warn("trust bundle not sent", "generation", res.Generation, "error", err)
	} else {
		md.Set(events.TrustBundleHeader, b)
	}
	if res.Signer != nil {
		// The named signer's roots, endorsed by the mesh CA, where sds-edge reads them.
		if b, err := json.Marshal(res.Signer); err != nil {
			s.log.Warn("named signer's roots not sent", "signer", signer, "error", err)
		} else {
			md.Set(events.SignerRootsHeader, string(b))
		}
	}
	if err := grpc.SetHeader(ctx, md); err != nil {
		s.log.Warn("response header not sent", "error", err)
	}
}

// bundleHeader is the JSON of res's trust bundle (events.BundleReply), encoded
// once per CA material.
func (s *Server) bundleHeader(res issuer.Result) (string, error) {
	if h := s.bundle.Load(); h != nil && h.mat == res.Bundle && res.Bundle != nil {
		return h.json, nil
	}
	b, err := json.Marshal(events.BundleReply{TrustDomain: s.iss.TrustDomain(), Roots: res.Roots,
		Generation: res.Generation, Endorsements: res.Endorsements})
	if err != nil {
		return "", err
	}
	s.bundle.Store(&encodedBundle{mat: res.Bundle, json: string(b)})
	return string(b), nil
}

// encodedBundle is a material's trust bundle as the header carries it.
type encodedBundle struct {
	mat  *ca.Material
	json string
}

func toStatus(err error) error {
	var ie *issuer.Error
	if !errors.As(err, &ie) {
		return status.Error(codes.Internal, err.Error())
	}
	c := codes.Internal
	switch ie.Code {
	case events.CodeInvalidArgument:
		c = codes.InvalidArgument
	case events.CodeUnauthenticated:
		c = codes.Unauthenticated
	case events.CodePermissionDenied:
		c = codes.PermissionDenied
	case events.CodeResourceExhausted:
		c = codes.ResourceExhausted
	case events.CodeUnavailable:
		c = codes.Unavailable
	case events.CodeDeadlineExceeded:
		c = codes.DeadlineExceeded
	}
	return status.Error(c, ie.Msg)
}
