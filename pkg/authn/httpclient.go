package authn

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// NewHTTPClient is the client for discovery and JWKS requests: it trusts the system
// roots and the PEM roots in caFile (in a Kubernetes pod, the cluster CA at
// /var/run/secrets/kubernetes.io/serviceaccount/ca.crt), so that one configuration
// reaches both an in-cluster issuer and a managed cluster's public one.
func NewHTTPClient(caFile string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("token issuer ca: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("token issuer ca: no PEM certificate in %s", caFile)
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}, nil
}

// callAPI sends req to the API server as the signer: with its own token from
// bearerFile (re-read each time: the kubelet rotates it) and c (nil: a plain client
// with reviewTimeout). It returns the status and at most limit+1 bytes of the body;
// an error is no answer at all.
func callAPI(c *http.Client, bearerFile string, req *http.Request, limit int64) (int, string, []byte, error) {
	req.Header.Set("Accept", "application/json")
	if bearerFile != "" {
		tok, err := os.ReadFile(bearerFile)
		if err != nil {
			return 0, "", nil, fmt.Errorf("the signer's own token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	if c == nil {
		c = &http.Client{Timeout: reviewTimeout}
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return 0, "", nil, fmt.Errorf("read answer: %w", err)
	}
	return resp.StatusCode, resp.Status, raw, nil
}
