package bus

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats-server/v2/server"
)

// testCA is a CA that writes PEM files for the bus flags.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{cert: cert, key: key, dir: t.TempDir()}
	ca.write(t, "ca.pem", "CERTIFICATE", der)
	return ca
}

func (ca *testCA) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// issue writes name-cert.pem and name-key.pem for a server and client certificate.
func (ca *testCA) issue(t *testing.T, name string) (certFile, keyFile string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	return ca.write(t, name+"-cert.pem", "CERTIFICATE", der), ca.write(t, name+"-key.pem", "PRIVATE KEY", kder)
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
	pool.AddCert(bus.cert)
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
