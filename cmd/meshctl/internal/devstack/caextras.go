package devstack

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/bustls"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/kubeapi"
	"github.com/meshagent/meshagent/pkg/atomicfile"
	"github.com/meshagent/meshagent/pkg/pki"
)

// The rest of istiod's CA, set up so that each can be shown from the command line
// against the local stack (README): a node agent the signer trusts to ask for the
// identity of a pod on its node, and a named signer with a chain of its own.
const (
	// NodeAgentNamespace/ServiceAccount/Pod is the trusted node agent (Istio's
	// ztunnel), on the one node every demo pod runs on.
	NodeAgentNamespace, NodeAgentServiceAccount, NodeAgentPod = "istio-system", "ztunnel", "ztunnel-0"
	// Node is the node the local stack's pods run on.
	Node = "meshctl-up"
	// PartnerSigner is the named signer (CERT_SIGNERS) with its own CA.
	PartnerSigner = "partner"
)

// federation returns the signer's flags for serving this domain's bundle and
// following others' (Config.BundleEndpointAddr, Federate). The endpoint's
// certificate comes from the bus CA, which is what another local stack trusts it by
// (-federate-ca <this dir>/secrets/bus-tls/ca.pem).
func (r *Runner) federation() ([]string, error) {
	var args []string
	if addr := r.cfg.BundleEndpointAddr; addr != "" {
		if host, port, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("-bundle-endpoint-addr %q: %w", addr, err)
		} else if port == "0" {
			ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
			if err != nil {
				return nil, fmt.Errorf("-bundle-endpoint-addr: %w", err)
			}
			addr = ln.Addr().String()
			_ = ln.Close()
		}
		tlsDir := filepath.Join(r.cfg.Dir, "secrets", "bus-tls")
		if err := bustls.Write(tlsDir, []string{"bundle-endpoint"}, busTLSLife, time.Now()); err != nil {
			return nil, fmt.Errorf("bundle endpoint: %w", err)
		}
		args = append(args, "-bundle-endpoint-addr", addr,
			"-bundle-endpoint-cert", filepath.Join(tlsDir, bustls.CertFile("bundle-endpoint")),
			"-bundle-endpoint-key", filepath.Join(tlsDir, bustls.KeyFile("bundle-endpoint")))
		r.Stack.Signer.BundleEndpoint = "https://" + addr
		r.Stack.Signer.BundleEndpointCA = filepath.Join(tlsDir, bustls.CAFile)
	}
	if r.cfg.Federate != "" {
		args = append(args, "-spiffe-bundle-endpoints", r.cfg.Federate, "-spiffe-bundle-min-refresh", "5s")
		if r.cfg.FederateCA != "" {
			args = append(args, "-spiffe-bundle-ca-file", r.cfg.FederateCA)
		}
		r.Stack.Signer.Federate = r.cfg.Federate
	}
	return args, nil
}

// partnerCALife is how long the partner signer's self-made CA is valid.
const partnerCALife = 10 * 365 * 24 * time.Hour

// startNodeAPI serves the pod reads the signer's node authorizer makes (kubeapi)
// on loopback HTTPS, with a server certificate from the bus CA and a bearer token
// made for this start, and returns the signer's flags for it.
func (r *Runner) startNodeAPI() ([]string, error) {
	secrets := filepath.Join(r.cfg.Dir, "secrets")
	tlsDir := filepath.Join(secrets, "bus-tls")
	if err := bustls.Write(tlsDir, []string{"kube-api"}, busTLSLife, time.Now()); err != nil {
		return nil, fmt.Errorf("node api: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(tlsDir, bustls.CertFile("kube-api")), filepath.Join(tlsDir, bustls.KeyFile("kube-api")))
	if err != nil {
		return nil, fmt.Errorf("node api: %w", err)
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	token := hex.EncodeToString(b)
	tokenFile := filepath.Join(secrets, "node-api-token")
	if err := atomicfile.Write(tokenFile, []byte(token), 0o600); err != nil {
		return nil, fmt.Errorf("node api: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("node api: %w", err)
	}
	r.nodeAPI = kubeapi.New(token)
	r.nodeAPI.Add(kubeapi.Pod{Namespace: NodeAgentNamespace, Name: NodeAgentPod, ServiceAccount: NodeAgentServiceAccount, Node: Node})
	srv := &http.Server{Handler: r.nodeAPI, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.log.Error("node api stopped", "error", err)
		}
	}()
	r.stopNodeAPI = func() { _ = srv.Close(); <-done }
	url := "https://" + ln.Addr().String()
	r.Stack.Signer.TrustedNodeAccounts = []string{NodeAgentNamespace + "/" + NodeAgentServiceAccount}
	r.Stack.Signer.NodeAPI = url
	return []string{"-trusted-node-accounts", NodeAgentNamespace + "/" + NodeAgentServiceAccount, "-node-api-url", url,
		"-node-api-ca-file", filepath.Join(tlsDir, bustls.CAFile), "-node-api-bearer-file", tokenFile}, nil
}

// partnerSigner makes the partner signer's CA material on the first start, in
// Istio's cacerts layout under Dir/secrets/signers/partner (its key 0600, kept for
// later starts), and returns the signer's flags for it.
func (r *Runner) partnerSigner() ([]string, error) {
	signers := filepath.Join(r.cfg.Dir, "secrets", "signers")
	dir := filepath.Join(signers, PartnerSigner)
	if _, err := os.Stat(filepath.Join(dir, "ca-key.pem")); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("partner signer: %w", err)
		}
		cert, key, err := bustls.MakeCA("meshagent demo partner CA", partnerCALife, time.Now())
		if err != nil {
			return nil, fmt.Errorf("partner signer: %w", err)
		}
		keyPEM, err := pki.EncodeKeyPEM(key, true)
		if err != nil {
			return nil, err
		}
		certPEM := pki.EncodeCertPEM(cert)
		// The key last: its presence says the directory is complete.
		for _, f := range []struct {
			name string
			data []byte
			mode os.FileMode
		}{{"ca-cert.pem", certPEM, 0o644}, {"cert-chain.pem", certPEM, 0o644}, {"root-cert.pem", certPEM, 0o644}, {"ca-key.pem", keyPEM, 0o600}} {
			if err := atomicfile.Write(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
				return nil, fmt.Errorf("partner signer: %w", err)
			}
		}
	} else if err != nil {
		return nil, fmt.Errorf("partner signer: %w", err)
	}
	r.Stack.Signer.CertSigners = []string{PartnerSigner}
	return []string{"-cert-signers", PartnerSigner, "-cert-signers-dir", signers}, nil
}
