//go:build istio

package istiotest_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/istiotest"
	"github.com/meshagent/meshagent/tests/kubetest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// The harness runs a real istiod: it makes its self-signed CA into the Secret
// istio-ca-secret, writes that root into a new namespace's istio-ca-root-cert, and
// serves its 15012 with a certificate from that root for 127.0.0.1 (a client
// trusting another root is refused); its /debug/syncz lists no proxy yet.
func TestIstiodHarnessRunsARealIstiod(t *testing.T) {
	kube := kubetest.Start(t)
	d := istiotest.Start(t, kube, istiotest.Config{})
	kube.Admin.Namespace(t, "shop", nil)
	_, roots := d.RootCert(t, "shop")

	var secret struct {
		Data map[string][]byte `json:"data"`
	}
	kube.Admin.Call(t, http.MethodGet, "/api/v1/namespaces/"+istiotest.Namespace+"/secrets/istio-ca-secret", nil, &secret)
	caCert, err := pki.ParseCertsPEM(secret.Data["ca-cert.pem"])
	if err != nil || len(caCert) != 1 || !caCert[0].Equal(roots[0]) || !caCert[0].IsCA {
		t.Fatalf("istio-ca-secret's ca-cert.pem (%v) is not the root istiod wrote into istio-ca-root-cert", err)
	}

	dial := func(root *x509.Certificate) error {
		pool := x509.NewCertPool()
		pool.AddCert(root)
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", d.SecureAddr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(roots[0]); err != nil {
		t.Errorf("istiod's 15012 trusting its root, as 127.0.0.1: %v", err)
	}
	other := testkit.SelfSigned(t, testkit.Spec{Name: "not-istiod", IsCA: true, Life: time.Hour})
	if err := dial(other.Cert); err == nil {
		t.Error("istiod's 15012 verified trusting another root")
	}
	if s := d.Syncz(t); len(s) != 0 {
		t.Errorf("istiod's syncz lists proxies before any connected: %v", s)
	}
}
