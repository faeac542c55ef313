// Package kubecsr has an external signer sign workload certificates through the
// Kubernetes CertificateSigningRequest API (certificates.k8s.io/v1), as istiod does
// as a registration authority (EXTERNAL_CA=ISTIOD_RA_KUBERNETES_API, K8S_SIGNER):
// the signer has authenticated the workload; this package creates a CSR object for
// the workload's own CSR, approves it, waits until the external signer (such as
// kube-controller-manager's csrsigning controller) writes the certificate, and
// deletes the object. A denied or failed CSR, or none signed in time, is an error
// naming why. The caller checks what it gets (CheckCSR before, CheckLeaf after):
// the external signer copies what the CSR asks for.
package kubecsr

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/signer/internal/kubeapi"
)

// DefaultUsages are the key usages istiod's RA asks for.
var DefaultUsages = []string{"digital signature", "key encipherment", "server auth", "client auth"}

// Config says which API server and signer to use.
type Config struct {
	URL        string // API server, https://host:port
	CAFile     string // its roots (PEM); "": the system's
	BearerFile string // the signer's token, re-read for each request
	SignerName string // spec.signerName (K8S_SIGNER)
	Usages     []string
	// Timeout bounds the wait for the certificate once the CSR is approved
	// (istiod: 60 s); the request's own deadline may end it sooner.
	Timeout time.Duration
}

// Client signs through the CSR API.
type Client struct {
	cfg Config
	api *kubeapi.Client
	log hclog.Logger
	clk clock.Clock
}

const (
	requestTimeout = 10 * time.Second
	maxBody        = 1 << 20
	briefLen       = 400
	basePath       = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
	// GenerateName prefixes the CSR objects' names, as istiod's.
	GenerateName = "csr-workload-"
)

// New builds a client; it talks to nothing until Sign.
func New(cfg Config, log hclog.Logger, clk clock.Clock) (*Client, error) {
	api, err := kubeapi.New(kubeapi.Config{URL: cfg.URL, CAFile: cfg.CAFile, BearerFile: cfg.BearerFile}, requestTimeout, maxBody, "csr api")
	if err != nil {
		return nil, err
	}
	if len(cfg.Usages) == 0 {
		cfg.Usages = DefaultUsages
	}
	return &Client{cfg: cfg, api: api, log: log, clk: clk}, nil
}

// Errors of Sign. ErrRefused wraps a CSR the external signer or an approver
// refused (Denied, Failed); ErrTimeout one nobody signed in time; ErrAPI an
// answer of the API server other than success (RBAC, validation), or none.
var (
	ErrRefused = errors.New("certificate signing request refused")
	ErrTimeout = errors.New("certificate signing request not signed in time")
	ErrAPI     = errors.New("certificate signing request API")
)

// csrObject is the part of a CertificateSigningRequest this package reads.
type csrObject struct {
	Metadata struct {
		Name            string `json:"name"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Status struct {
		Certificate []byte      `json:"certificate"`
		Conditions  []condition `json:"conditions"`
	} `json:"status"`
}

type condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Sign has the external signer sign csrPEM for ttl (0: the signer's default) and
// returns the PEM chain it wrote (the leaf, and whatever it put after it). The CSR
// object is deleted on every path once created, as istiod deletes it.
func (c *Client) Sign(ctx context.Context, csrPEM []byte, ttl time.Duration) ([]byte, error) {
	spec := map[string]any{"request": csrPEM, "signerName": c.cfg.SignerName, "usages": c.cfg.Usages}
	if ttl > 0 {
		spec["expirationSeconds"] = int64(ttl / time.Second)
	}
	body, err := json.Marshal(map[string]any{
		"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
		"metadata": map[string]any{"generateName": GenerateName}, "spec": spec,
	})
	if err != nil {
		return nil, err
	}
	code, raw, err := c.api.Do(ctx, http.MethodPost, basePath, body, "application/json")
	if err != nil {
		return nil, fmt.Errorf("%w: create csr: %w", ErrAPI, err)
	}
	if code != http.StatusCreated && code != http.StatusOK {
		return nil, fmt.Errorf("%w: create csr for signer %s: %d %s", ErrAPI, c.cfg.SignerName, code, kubeapi.Brief(raw, briefLen))
	}
	var obj map[string]any
	var created csrObject
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("create csr: %w", err)
	}
	if err := json.Unmarshal(raw, &created); err != nil || created.Metadata.Name == "" {
		return nil, fmt.Errorf("create csr: the answer names no object: %s", kubeapi.Brief(raw, briefLen))
	}
	name := created.Metadata.Name
	defer c.delete(name)
	approved, err := c.approve(ctx, name, obj)
	if err != nil {
		return nil, err
	}
	if err := verdict(name, approved); err != nil {
		return nil, err
	}
	if len(approved.Status.Certificate) > 0 {
		return approved.Status.Certificate, nil
	}
	return c.wait(ctx, name, approved.Metadata.ResourceVersion)
}

// approve adds the Approved condition (the approval subresource) and returns the
// object as it is after it.
func (c *Client) approve(ctx context.Context, name string, obj map[string]any) (csrObject, error) {
	msg := "approved by meshagent's signer, which authenticated the workload"
	status, _ := obj["status"].(map[string]any)
	if status == nil {
		status = map[string]any{}
	}
	conds, _ := status["conditions"].([]any)
	status["conditions"] = append(conds, map[string]any{"type": "Approved", "status": "True", "reason": "MeshagentSignerApproved", "message": msg})
	obj["status"] = status
	var after csrObject
	body, err := json.Marshal(obj)
	if err != nil {
		return after, err
	}
	code, raw, err := c.api.Do(ctx, http.MethodPut, basePath+"/"+url.PathEscape(name)+"/approval", body, "application/json")
	if err != nil {
		return after, fmt.Errorf("%w: approve csr %s: %w", ErrAPI, name, err)
	}
	if code != http.StatusOK {
		return after, fmt.Errorf("%w: approve csr %s: %d %s", ErrAPI, name, code, kubeapi.Brief(raw, briefLen))
	}
	if err := json.Unmarshal(raw, &after); err != nil {
		return after, fmt.Errorf("approve csr %s: %w", name, err)
	}
	return after, nil
}

// wait watches the object from version rv until it holds a certificate, is
// denied or failed, or the timeout (or ctx) ends.
func (c *Client) wait(ctx context.Context, name, rv string) ([]byte, error) {
	timeout := c.cfg.Timeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		began := c.clk.Now()
		cert, next, err := c.watchOnce(wctx, name, rv)
		if cert != nil || (err != nil && !errors.Is(err, errWatchEnded)) {
			return cert, err
		}
		if next != "" {
			rv = next
		}
		// A watch the server ended at once is not opened again at once.
		if d := rewatchPause - c.clk.Now().Sub(began); d > 0 {
			t := c.clk.NewTimer(d)
			select {
			case <-wctx.Done():
			case <-t.C():
			}
			t.Stop()
		}
		if wctx.Err() != nil {
			return nil, fmt.Errorf("%w: csr %s for signer %s: no certificate within %s (is the signer running, and does it sign %q?)",
				ErrTimeout, name, c.cfg.SignerName, timeout, c.cfg.SignerName)
		}
	}
}

// rewatchPause is the least time between two watches of one CSR.
const rewatchPause = 100 * time.Millisecond

var errWatchEnded = errors.New("watch ended")

// watchOnce watches from rv; it returns the certificate, or a verdict, or
// errWatchEnded with the last version seen when the watch ends without either.
func (c *Client) watchOnce(ctx context.Context, name, rv string) ([]byte, string, error) {
	q := url.Values{"fieldSelector": {"metadata.name=" + name}, "watch": {"1"}, "resourceVersion": {rv}, "timeoutSeconds": {"30"}}
	resp, err := c.api.Watch(ctx, basePath+"?"+q.Encode())
	if err != nil {
		if ctx.Err() != nil {
			return nil, rv, errWatchEnded
		}
		return nil, rv, fmt.Errorf("%w: watch csr %s: %w", ErrAPI, name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, rv, fmt.Errorf("%w: watch csr %s: %d %s", ErrAPI, name, resp.StatusCode, kubeapi.Brief(raw, briefLen))
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, 64<<20))
	for {
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			return nil, rv, errWatchEnded
		}
		switch ev.Type {
		case "ADDED", "MODIFIED":
			var o csrObject
			if err := json.Unmarshal(ev.Object, &o); err != nil {
				return nil, rv, fmt.Errorf("watch csr %s: %w", name, err)
			}
			rv = o.Metadata.ResourceVersion
			if err := verdict(name, o); err != nil {
				return nil, rv, err
			}
			if len(o.Status.Certificate) > 0 {
				return o.Status.Certificate, rv, nil
			}
		case "DELETED":
			return nil, rv, fmt.Errorf("%w: csr %s was deleted before it was signed", ErrRefused, name)
		case "ERROR": // 410 Gone: the version is too old; istiod's watch would hang, this one says so
			return nil, rv, fmt.Errorf("%w: watch csr %s: %s", ErrAPI, name, kubeapi.Brief(ev.Object, briefLen))
		}
	}
}

// verdict is the refusal o's conditions hold, if any: Denied (by an approver)
// or Failed (the signer could not or would not sign it).
func verdict(name string, o csrObject) error {
	for _, cd := range o.Status.Conditions {
		if cd.Status != "True" || (cd.Type != "Denied" && cd.Type != "Failed") {
			continue
		}
		return fmt.Errorf("%w: csr %s %s: %s: %s", ErrRefused, name, strings.ToLower(cd.Type), cd.Reason, cd.Message)
	}
	return nil
}

// delete removes the CSR object whatever became of the request (its own
// context: the request's may be over).
func (c *Client) delete(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	code, raw, err := c.api.Do(ctx, http.MethodDelete, basePath+"/"+url.PathEscape(name), nil, "")
	if err != nil || (code != http.StatusOK && code != http.StatusAccepted && code != http.StatusNotFound) {
		c.log.Warn("csr not deleted", "csr", name, "status", code, "answer", kubeapi.Brief(raw, briefLen), "error", err)
	}
}
