// Package kubeapi is the signer's plain HTTPS client of the Kubernetes API server,
// shared by what the signer does there (the root ConfigMap in every namespace,
// rootcm; CertificateSigningRequests as a registration authority, kubecsr): the
// server's roots, the signer's own token re-read for every request (the kubelet
// rotates it), bounded answers, and a second client without a timeout for
// watches, which the server and the caller's context end.
package kubeapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// Config says which API server, trusted how, and as whom.
type Config struct {
	URL        string // https://host:port
	CAFile     string // its roots (PEM); "": the system's
	BearerFile string // the signer's token, re-read for each request
}

// Client sends requests as the signer.
type Client struct {
	cfg     Config
	maxBody int64
	timed   *http.Client // requests with a timeout
	watches *http.Client // watches: no timeout but the server's and the context's
}

// New builds a client whose requests time out after timeout and whose answers
// may hold maxBody bytes; what names the caller in errors.
func New(cfg Config, timeout time.Duration, maxBody int64, what string) (*Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%s: api server ca: %w", what, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate in %s", what, cfg.CAFile)
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	return &Client{cfg: cfg, maxBody: maxBody, timed: &http.Client{Transport: tr, Timeout: timeout}, watches: &http.Client{Transport: tr}}, nil
}

// Do sends one request (body of contentType, or none) and returns the status and
// the answer, at most maxBody bytes of it.
func (c *Client) Do(ctx context.Context, method, path string, body []byte, contentType string) (int, []byte, error) {
	req, err := c.request(ctx, method, path, body, contentType)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.timed.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, c.maxBody+1))
	if err == nil && int64(len(raw)) > c.maxBody {
		err = fmt.Errorf("answer larger than %d bytes", c.maxBody)
	}
	return resp.StatusCode, raw, err
}

// Watch opens a GET of path (a watch) that only ctx and the server end; the
// caller reads and closes the answer.
func (c *Client) Watch(ctx context.Context, path string) (*http.Response, error) {
	req, err := c.request(ctx, http.MethodGet, path, nil, "")
	if err != nil {
		return nil, err
	}
	return c.watches.Do(req)
}

func (c *Client) request(ctx context.Context, method, path string, body []byte, contentType string) (*http.Request, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.cfg.URL, "/")+path, r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.cfg.BearerFile != "" {
		tok, err := os.ReadFile(c.cfg.BearerFile)
		if err != nil {
			return nil, fmt.Errorf("the signer's own token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	return req, nil
}

// Brief is an API server's answer cut to n bytes, for an error or a log line.
func Brief(raw []byte, n int) string {
	s := strings.TrimSpace(string(raw))
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}
