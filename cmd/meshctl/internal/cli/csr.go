package cli

import (
	"cmp"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1 "istio.io/api/security/v1alpha1"
)

// csrFlags is one CreateCertificate, as an Istio agent (or ztunnel) sends it.
type csrFlags struct {
	addr, serverName, rootFile string
	token, ns, sa              string
	certFile, keyFile          string
	impersonate, signer        string
	id, alg                    string
	ttl                        time.Duration
	// bus: renew by certificate over the bus (as pod) instead of gRPC.
	bus                  bool
	pod, natsURL, natsCA string
	out                  string
}

// bind binds f to csr's flags.
func (f *csrFlags) bind(fs *flagenv.Set) {
	fs.String(&f.addr, "ca-addr", "CA_ADDR", "", "CA gRPC address (default: the local stack's signer)")
	fs.String(&f.serverName, "ca-server-name", "", "", "TLS server name of the CA (default: the local stack's, else the host of -ca-addr)")
	fs.String(&f.rootFile, "ca-root-cert", "", "", "PEM roots to verify the CA (default: the local stack's trust bundle)")
	fs.String(&f.token, "token", "", "", "bearer token file; default: a token minted from the local stack for -ns/-sa")
	fs.String(&f.ns, "ns", "POD_NAMESPACE", "", "namespace of the minted token's service account")
	fs.String(&f.sa, "sa", "SERVICE_ACCOUNT", "", "service account of the minted token")
	fs.String(&f.certFile, "cert", "", "", "renew by certificate: present this PEM chain over mTLS instead of a token (Istio's PROV_CERT / VM flow)")
	fs.String(&f.keyFile, "key", "", "", "key of -cert")
	fs.String(&f.impersonate, "impersonate", "", "", "ask for this SPIFFE ID instead of the caller's own (ImpersonatedIdentity; only trusted node accounts may)")
	fs.String(&f.signer, "signer", "", "", "CertSigner to sign with (one of the CA's CERT_SIGNERS)")
	fs.String(&f.id, "id", "", "", "SPIFFE ID the CSR asks for (the CA decides; default spiffe://<td>/ns/<ns>/sa/<sa>)")
	fs.String(&f.alg, "key-alg", "", string(pki.ECP256), "key algorithm")
	fs.Duration(&f.ttl, "ttl", "", time.Hour, "requested certificate TTL")
	fs.Bool(&f.bus, "bus", "", false, "renew by certificate over the bus instead of gRPC: connect presenting -cert (no token), admitted as -pod (a VM)")
	fs.String(&f.pod, "pod", "", "", "the pod the minted token is bound to, a name in -ns or <ns>/<name> (a node agent impersonating needs one); with -bus: the pod -cert was issued to, <ns>/<name> or a name in the default namespace")
	fs.String(&f.natsURL, "nats-url", "NATS_URL", "", "with -bus: NATS URL (default: the local stack's)")
	fs.String(&f.natsCA, "nats-tls-ca", "NATS_TLS_CA", "", "with -bus: CA to verify the bus's TLS (default: the local stack's bus CA)")
	fs.String(&f.out, "out", "", "", "write the new key.pem (0600), cert-chain.pem and root-cert.pem here (as OUTPUT_CERTS and PROV_CERT hold them)")
}

// runCSR sends one CreateCertificate over the Istio gRPC API and prints the chain it
// got: with a token (minted from the local stack for -ns/-sa, or -token), or over
// mTLS with -cert/-key (renewal by certificate, no token); -impersonate asks for a
// workload's identity as a trusted node agent does, -signer names a CertSigner.
// With -bus, -cert/-key renew over the bus instead, admitted as -pod by the
// certificate alone (csrOverBus).
func runCSR(ctx context.Context, env Env, args []string) error {
	var dir string
	var f csrFlags
	fs := flagenv.New("csr", env.Getenv)
	dirFlag(fs, &dir)
	f.bind(fs)
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	if (f.certFile == "") != (f.keyFile == "") {
		return errors.New("-cert and -key: set both or neither")
	}
	if f.bus {
		return runCSRBus(ctx, env, dir, f)
	}
	var st *stackfile.Stack
	if f.addr == "" || f.rootFile == "" || (f.certFile == "" && f.token == "") {
		s, err := stackfile.Read(dir)
		if err != nil {
			return fmt.Errorf("%w (or set -ca-addr, -ca-root-cert and -token or -cert/-key)", err)
		}
		st = s
	}
	tok, err := f.bearer(dir, st)
	if err != nil {
		return err
	}
	if err := f.defaults(st); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	key, chain, err := createCertificate(ctx, f, tok)
	if err != nil {
		return err
	}
	if err := printChain(env.Stdout, chain); err != nil {
		return err
	}
	return writeCerts(env.Stdout, f.out, key, chain)
}

// bearer is the token to send: none with -cert, -token's, else one minted from
// the local stack for -ns/-sa (bound to -pod when given).
func (f *csrFlags) bearer(dir string, st *stackfile.Stack) (string, error) {
	switch {
	case f.certFile != "":
		return "", nil
	case f.token != "":
		b, err := os.ReadFile(f.token)
		if err != nil {
			return "", fmt.Errorf("-token: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	if f.ns == "" || f.sa == "" {
		return "", errors.New("-ns and -sa: required to mint a token (or give -token, or -cert/-key)")
	}
	iss, err := devtoken.Load(filepath.Join(dir, "issuer"))
	if err != nil {
		return "", err
	}
	podName := ""
	if f.pod != "" {
		p, err := mintPod(f.ns, f.pod)
		if err != nil {
			return "", fmt.Errorf("-pod: %w", err)
		}
		podName = p.Name
	}
	return iss.MintForPod(f.ns, f.sa, podName, st.TokenIssuer.Audience, 10*time.Minute, time.Now())
}

// defaults fills in what the flags left out from the local stack: the CA's
// address, server name and roots, and the SPIFFE ID of -ns/-sa.
func (f *csrFlags) defaults(st *stackfile.Stack) error {
	if f.addr == "" {
		f.addr = st.Signer.GRPCAddr
		if f.serverName == "" {
			f.serverName = st.Signer.GRPCServerName
		}
	}
	if f.rootFile == "" {
		f.rootFile = st.TrustBundle
	}
	if f.id != "" {
		return nil
	}
	td := "cluster.local"
	if st != nil {
		td = st.TrustDomain
	}
	ns, sa := f.ns, f.sa
	if ns == "" || sa == "" {
		ns, sa = "default", "default"
	}
	id, err := pki.WorkloadID(td, ns, sa)
	if err != nil {
		return err
	}
	f.id = id.String()
	return nil
}

// runCSRBus is runCSR with -bus: renewal by certificate over the bus.
func runCSRBus(ctx context.Context, env Env, dir string, f csrFlags) error {
	switch {
	case f.certFile == "":
		return errors.New("-bus: needs -cert and -key (the bus admits a pod with no token by its certificate)")
	case f.pod == "":
		return errors.New("-bus: needs -pod, the pod -cert was issued to")
	case f.token != "" || f.impersonate != "" || f.signer != "":
		return errors.New("-bus: not with -token, -impersonate or -signer")
	}
	if f.natsURL == "" || f.natsCA == "" {
		st, err := stackfile.Read(dir)
		if err != nil {
			return fmt.Errorf("%w (or set -nats-url and -nats-tls-ca)", err)
		}
		f.natsURL, f.natsCA = cmp.Or(f.natsURL, st.NATSURL), cmp.Or(f.natsCA, st.NATSTLSCA)
	}
	if f.natsCA == "" {
		return errors.New("-nats-tls-ca: required (the certificate is presented over TLS)")
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	key, chain, err := csrOverBus(ctx, f, f.natsURL, f.natsCA)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "bus        admitted as pod %s by its certificate alone (no token)\n", f.pod)
	if err := printChain(env.Stdout, chain); err != nil {
		return err
	}
	return writeCerts(env.Stdout, f.out, key, chain)
}

// createCertificate makes a key and CSR and sends them with f's credential and
// metadata; it returns the key and the chain the CA returned.
func createCertificate(ctx context.Context, f csrFlags, tok string) (crypto.Signer, []*x509.Certificate, error) {
	ca := istioCA{addr: f.addr, serverName: f.serverName, rootFile: f.rootFile, rootsFlag: "-ca-root-cert"}
	if f.certFile != "" {
		c, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("-cert/-key: %w", err)
		}
		ca.cert = &c
	}
	_, key, csr, err := newKeyCSR(f.alg, f.id)
	if err != nil {
		return nil, nil, err
	}
	req := &securityv1.IstioCertificateRequest{Csr: string(csr), ValidityDuration: int64(f.ttl.Seconds())}
	fields := map[string]*structpb.Value{}
	if f.impersonate != "" {
		fields["ImpersonatedIdentity"] = structpb.NewStringValue(f.impersonate)
	}
	if f.signer != "" {
		fields["CertSigner"] = structpb.NewStringValue(f.signer)
	}
	if len(fields) > 0 {
		req.Metadata = &structpb.Struct{Fields: fields}
	}
	chain, err := ca.create(ctx, tok, req)
	if err != nil {
		return nil, nil, err
	}
	certs, err := pki.ParseCertPEMs(chain)
	if err != nil {
		return nil, nil, fmt.Errorf("reply chain: %w", err)
	}
	if len(certs) == 0 {
		return nil, nil, errors.New("reply chain is empty")
	}
	return key, certs, nil
}

// istioCA is a CA asked over the Istio gRPC API: its address, TLS server name
// and roots (rootsFlag names where the roots came from, in errors), and the
// client certificate presented when renewing by certificate.
type istioCA struct {
	addr, serverName, rootFile, rootsFlag string
	cert                                  *tls.Certificate
}

// create sends one CreateCertificate, with tok as its bearer token unless it is
// "", and returns the chain the CA returned.
func (ca istioCA) create(ctx context.Context, tok string, req *securityv1.IstioCertificateRequest) ([]string, error) {
	roots, err := os.ReadFile(ca.rootFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ca.rootsFlag, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(roots) {
		return nil, fmt.Errorf("%s: %s holds no certificate", ca.rootsFlag, ca.rootFile)
	}
	tc := &tls.Config{RootCAs: pool, ServerName: ca.serverName, MinVersion: tls.VersionTLS12}
	if ca.cert != nil {
		tc.Certificates = []tls.Certificate{*ca.cert}
	}
	cc, err := grpc.NewClient(ca.addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", ca.addr, err)
	}
	defer cc.Close()
	md := metadata.Pairs("ClusterID", "Kubernetes")
	if tok != "" {
		md.Set("authorization", "Bearer "+tok)
	}
	resp, err := securityv1.NewIstioCertificateServiceClient(cc).CreateCertificate(metadata.NewOutgoingContext(ctx, md), req)
	if err != nil {
		return nil, fmt.Errorf("CreateCertificate: %w", err)
	}
	return resp.GetCertChain(), nil
}

// newKeyCSR makes a key of algorithm alg (-key-alg) and a CSR for id (-id).
func newKeyCSR(alg, id string) (pki.KeyAlg, crypto.Signer, []byte, error) {
	a, err := pki.ParseKeyAlg(alg)
	if err != nil {
		return "", nil, nil, fmt.Errorf("-key-alg: %w", err)
	}
	key, err := pki.GenerateKey(a)
	if err != nil {
		return "", nil, nil, err
	}
	csr, err := pki.NewCSR(key, id)
	if err != nil {
		return "", nil, nil, fmt.Errorf("-id: %w", err)
	}
	return a, key, csr, nil
}

// printChain shows the identity and each certificate of the chain, leaf first.
func printChain(w io.Writer, certs []*x509.Certificate) error {
	leaf := certs[0]
	uri := "-"
	if len(leaf.URIs) > 0 {
		uri = leaf.URIs[0].String()
	}
	fmt.Fprintf(w, "identity   %s\nvalid      %s .. %s\nchain      %d certificates\n", uri,
		leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339), len(certs))
	for i, c := range certs {
		fmt.Fprintf(w, "  [%d] %-30s issuer %-30s sha256 %s\n", i, c.Subject.CommonName+uriOf(c), c.Issuer.CommonName, pki.Fingerprint(c)[:16])
	}
	return nil
}

func uriOf(c *x509.Certificate) string {
	if len(c.URIs) == 0 {
		return ""
	}
	return " " + c.URIs[0].String()
}
