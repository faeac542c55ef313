package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stack"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	securityv1 "istio.io/api/security/v1alpha1"
)

func runSign(ctx context.Context, env Env, args []string) error {
	var dir, ns, sa, out, alg string
	var ttl time.Duration
	var useGRPC bool
	var bf busFlags
	fs := flagenv.New("sign", env.Getenv)
	dirFlag(fs, &dir)
	bf.bind(fs)
	fs.String(&ns, "ns", "POD_NAMESPACE", "", "namespace of the identity")
	fs.String(&sa, "sa", "SERVICE_ACCOUNT", "", "service account of the identity")
	fs.String(&alg, "key-alg", "", string(pki.ECP256), "key algorithm")
	fs.Duration(&ttl, "ttl", "", time.Hour, "requested certificate TTL")
	fs.String(&out, "out", "", "", "write key.pem (0600), cert-chain.pem and root-cert.pem here")
	fs.Bool(&useGRPC, "grpc", "", false, "use the Istio gRPC API (as an Istio agent would) instead of NATS")
	if err := parse(fs, env, args); err != nil {
		return err
	}
	st, err := stack.Read(dir)
	if err != nil {
		return err
	}
	ka, err := pki.ParseKeyAlg(alg)
	if err != nil {
		return err
	}
	iss, err := devtoken.Load(filepath.Join(dir, "issuer"))
	if err != nil {
		return err
	}
	tok, err := iss.Mint(ns, sa, st.TokenIssuer.Audience, 10*time.Minute, time.Now())
	if err != nil {
		return err
	}
	key, err := pki.GenerateKey(ka)
	if err != nil {
		return err
	}
	id, err := pki.WorkloadID(st.TrustDomain, ns, sa)
	if err != nil {
		return err
	}
	csr, err := pki.NewCSR(key, id.String())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var chain []string
	if useGRPC {
		chain, err = signGRPC(ctx, st, string(csr), tok, ttl)
	} else {
		chain, err = signNATS(ctx, &bf, st, events.SignRequest{CSR: string(csr), Token: tok, TTL: ttl, KeyAlgorithm: string(ka)})
	}
	if err != nil {
		return err
	}
	certs, err := pki.ParseCertPEMs(chain)
	if err != nil {
		return fmt.Errorf("reply chain: %w", err)
	}
	leaf, root := certs[0], certs[len(certs)-1]
	uri := "-"
	if len(leaf.URIs) > 0 {
		uri = leaf.URIs[0].String()
	}
	fmt.Fprintf(env.Stdout, "identity   %s\nserial     %s\nvalid      %s .. %s\nchain      %d certificates, root %s (sha256 %s)\n",
		uri, pki.SerialHex(leaf), leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339),
		len(certs), root.Subject, pki.Fingerprint(root)[:16])
	if out == "" {
		return nil
	}
	keyPEM, err := pki.EncodeKeyPEM(key, false)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o700); err != nil {
		return err
	}
	files := []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{"key.pem", keyPEM, 0o600},
		{"cert-chain.pem", pki.EncodeCertsPEM(certs[:len(certs)-1]), 0o644},
		{"root-cert.pem", pki.EncodeCertPEM(root), 0o644},
	}
	for _, f := range files {
		if err := writeFile(filepath.Join(out, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	fmt.Fprintf(env.Stdout, "written    %s/{key.pem,cert-chain.pem,root-cert.pem}\n", out)
	return nil
}

func signNATS(ctx context.Context, bf *busFlags, st *stack.Stack, req events.SignRequest) ([]string, error) {
	nc, err := bf.connect(ctx, st, "meshctl sign")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	msg, err := events.NewMsg(events.SubjectSignAny, "meshctl", req)
	if err != nil {
		return nil, err
	}
	resp, err := nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("sign over nats: %w", err)
	}
	reply, _, err := events.Decode[events.SignReply](resp)
	if err != nil {
		return nil, fmt.Errorf("sign reply: %w", err)
	}
	if reply.Error != nil {
		return nil, fmt.Errorf("signer refused: %w", reply.Error)
	}
	return reply.CertChain, nil
}

func signGRPC(ctx context.Context, st *stack.Stack, csr, tok string, ttl time.Duration) ([]string, error) {
	bundle, err := os.ReadFile(st.TrustBundle)
	if err != nil {
		return nil, fmt.Errorf("trust bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return nil, errors.New("trust bundle holds no certificate")
	}
	creds := credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: st.Signer.GRPCServerName, MinVersion: tls.VersionTLS12})
	cc, err := grpc.NewClient(st.Signer.GRPCAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", st.Signer.GRPCAddr, err)
	}
	defer cc.Close()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok, "ClusterID", "Kubernetes")
	resp, err := securityv1.NewIstioCertificateServiceClient(cc).CreateCertificate(ctx,
		&securityv1.IstioCertificateRequest{Csr: csr, ValidityDuration: int64(ttl.Seconds())})
	if err != nil {
		return nil, fmt.Errorf("CreateCertificate: %w", err)
	}
	return resp.GetCertChain(), nil
}

// writeFile replaces path atomically with data at exactly mode: a key.pem left by an
// earlier run with a looser mode does not keep it.
func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return os.Rename(tmp.Name(), path)
}
