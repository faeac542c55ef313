package cli

import (
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/busrpc"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/atomicfile/certdir"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/pki"
	securityv1 "istio.io/api/security/v1alpha1"
)

func runSign(ctx context.Context, env Env, args []string) error {
	var dir, ns, sa, pod, out, alg string
	var ttl time.Duration
	var useGRPC bool
	var bf busFlags
	fs := flagenv.New("sign", env.Getenv)
	dirFlag(fs, &dir)
	bf.bind(fs)
	fs.String(&ns, "ns", "POD_NAMESPACE", "", "namespace of the identity")
	fs.String(&sa, "sa", "SERVICE_ACCOUNT", "", "service account of the identity")
	fs.String(&pod, "pod", "", "", "bind the minted token to this pod (a name in -ns, or <ns>/<name>): the certificate is recorded as issued to it, so it admits that pod to the bus later (a VM's provisioned certificate, PROV_CERT)")
	fs.String(&alg, "key-alg", "", string(pki.ECP256), "key algorithm")
	fs.Duration(&ttl, "ttl", "", time.Hour, "requested certificate TTL")
	fs.String(&out, "out", "", "", "write key.pem (0600), cert-chain.pem and root-cert.pem here, as OUTPUT_CERTS holds them")
	fs.Bool(&useGRPC, "grpc", "", false, "use the Istio gRPC API (as an Istio agent would) instead of NATS")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	st, err := stackfile.Read(dir)
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
	var tok string
	var podRef events.PodRef
	if pod != "" {
		if podRef, err = mintPod(ns, pod); err != nil {
			return fmt.Errorf("-pod: %w", err)
		}
		tok, err = iss.MintForPod(ns, sa, podRef.Name, st.TokenIssuer.Audience, 10*time.Minute, time.Now())
	} else {
		tok, err = iss.Mint(ns, sa, st.TokenIssuer.Audience, 10*time.Minute, time.Now())
	}
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
		chain, err = signNATS(ctx, &bf, st, events.SignRequest{CSR: string(csr), Token: tok, TTL: ttl, KeyAlgorithm: string(ka), Pod: podRef})
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
	return writeCerts(env.Stdout, out, key, certs)
}

// writeCerts writes key (0600), the chain without its root and the root into out as
// OUTPUT_CERTS (and PROV_CERT) hold them; nothing when out is "".
func writeCerts(w io.Writer, out string, key crypto.Signer, certs []*x509.Certificate) error {
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
	root := certs[len(certs)-1]
	if err := certdir.Write(out, keyPEM, pki.EncodeCertsPEM(certs[:len(certs)-1]), pki.EncodeCertPEM(root)); err != nil {
		return err
	}
	fmt.Fprintf(w, "written    %s/{%s,%s,%s}\n", out, certdir.KeyFile, certdir.ChainFile, certdir.RootFile)
	return nil
}

func signNATS(ctx context.Context, bf *busFlags, st *stackfile.Stack, req events.SignRequest) ([]string, error) {
	nc, err := bf.connect(ctx, st, "meshctl sign")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	reply, err := busrpc.Sign(ctx, nc, events.SubjectSignAny, req, "sign over nats")
	if err != nil {
		return nil, err
	}
	if reply.Error != nil {
		return nil, fmt.Errorf("signer refused: %w", reply.Error)
	}
	return reply.CertChain, nil
}

func signGRPC(ctx context.Context, st *stackfile.Stack, csr, tok string, ttl time.Duration) ([]string, error) {
	ca := istioCA{addr: st.Signer.GRPCAddr, serverName: st.Signer.GRPCServerName, rootFile: st.TrustBundle, rootsFlag: "trust bundle"}
	return ca.create(ctx, tok, &securityv1.IstioCertificateRequest{Csr: csr, ValidityDuration: int64(ttl.Seconds())})
}
