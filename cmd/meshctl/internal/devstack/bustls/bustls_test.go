package bustls

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRoutesHandshakeMutually checks that two servers' certificates complete a real
// mutual TLS handshake under the bus CA, as cluster routes do, that keys are 0600, and
// that a second Write reuses the CA.
func TestRoutesHandshakeMutually(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, []string{"nats-1", "nats-2"}, time.Hour, time.Now()); err != nil {
		t.Fatal(err)
	}
	ca1, _ := os.ReadFile(filepath.Join(dir, CAFile))
	if err := Write(dir, []string{"nats-3"}, time.Hour, time.Now()); err != nil {
		t.Fatal(err)
	}
	if ca2, _ := os.ReadFile(filepath.Join(dir, CAFile)); string(ca1) != string(ca2) {
		t.Fatal("second Write made a new CA")
	}
	for _, f := range []string{"ca-key.pem", KeyFile("nats-1"), KeyFile("nats-3")} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, fi.Mode(), err)
		}
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca1)
	load := func(s string) tls.Certificate {
		c, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile(s)), filepath.Join(dir, KeyFile(s)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{load("nats-1")},
		ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("x")) // runs the handshake; fails for a stranger
			_ = c.Close()
		}
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "nats-1", Certificates: []tls.Certificate{load("nats-3")}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.ReadAll(c); err != nil {
		t.Fatal(err)
	}
	// A stranger's CA does not verify the server.
	other := t.TempDir()
	if err := Write(other, []string{"x"}, time.Hour, time.Now()); err != nil {
		t.Fatal(err)
	}
	op, _ := os.ReadFile(filepath.Join(other, CAFile))
	strangers := x509.NewCertPool()
	strangers.AppendCertsFromPEM(op)
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if err := tls.Client(raw, &tls.Config{RootCAs: strangers, ServerName: "nats-1"}).Handshake(); err == nil {
		t.Fatal("handshake verified under a foreign CA")
	}
	if err := Write(dir, []string{"../evil"}, time.Hour, time.Now()); err == nil {
		t.Fatal("path in server name accepted")
	}
}
