package bus

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/meshagent/meshagent/tests/testkit"
)

// testCA is a test CA (tests/testkit) that writes PEM files for the bus flags.
type testCA struct {
	*testkit.CA
	dir string
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	ca := &testCA{CA: testkit.NewCA(t, name, nil, time.Now(), time.Hour), dir: t.TempDir()}
	ca.write(t, "ca.pem", ca.PEM())
	return ca
}

func (ca *testCA) write(t *testing.T, name, pem string) string {
	t.Helper()
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, []byte(pem), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// issue writes name-cert.pem and name-key.pem for a server and client certificate.
func (ca *testCA) issue(t *testing.T, name string) (certFile, keyFile string) {
	t.Helper()
	l := ca.Issue(t, testkit.Spec{Name: name, DNS: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	return ca.write(t, name+"-cert.pem", l.PEM()), ca.write(t, name+"-key.pem", l.KeyPEM(t))
}

// TestConnectOverTLSAndMutualTLS drives Connect's -nats-tls-* flags against a real
// nats-server that requires TLS and verifies client certificates: the bus CA's client
// connects; a client that does not trust the server's CA, one with no certificate, and
// one with a certificate from another CA (another trust domain's) are refused.
func TestConnectOverTLSAndMutualTLS(t *testing.T) {
	bus, other := newTestCA(t, "bus CA"), newTestCA(t, "another trust domain")
	srvCert, srvKey := bus.issue(t, "nats")
	pair, err := tls.LoadX509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(bus.Cert)
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		TLS: true, TLSVerify: true, TLSTimeout: 2,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	url := "tls://" + s.Addr().String()
	ctx := context.Background()
	goodCert, goodKey := bus.issue(t, "signer")
	strangerCert, strangerKey := other.issue(t, "signer")
	for _, tc := range []struct {
		name string
		tls  TLSConfig
		ok   bool
	}{
		{"bus CA client certificate", TLSConfig{CAFile: filepath.Join(bus.dir, "ca.pem"), CertFile: goodCert, KeyFile: goodKey}, true},
		{"server not trusted", TLSConfig{CAFile: filepath.Join(other.dir, "ca.pem"), CertFile: goodCert, KeyFile: goodKey}, false},
		{"no client certificate", TLSConfig{CAFile: filepath.Join(bus.dir, "ca.pem")}, false},
		{"client certificate of another CA", TLSConfig{CAFile: filepath.Join(bus.dir, "ca.pem"), CertFile: strangerCert, KeyFile: strangerKey}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := Connect(ctx, Config{URL: url, TLS: tc.tls, Name: "t", ConnectWait: time.Nanosecond}, hclog.NewNullLogger())
			if tc.ok != (err == nil) {
				t.Fatalf("connect: %v, want ok=%v", err, tc.ok)
			}
			if err != nil {
				return
			}
			defer nc.Close()
			if !nc.TLSRequired() {
				t.Fatal("connection is not TLS")
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
		})
	}
	if n := s.NumClients(); n > 1 {
		t.Fatalf("%d clients still connected", n)
	}
}
