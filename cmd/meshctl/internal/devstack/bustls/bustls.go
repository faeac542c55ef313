// Package bustls makes the TLS material of a NATS cluster: a bus CA and, per server, a
// certificate for client connections and cluster routes (server and client auth, so
// routes are mutual TLS). Keys are made here and written only to the output directory,
// 0600. It serves the compose stack and the local one (meshctl up); a fleet with
// its own PKI brings its own certs.
package bustls

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/meshagent/meshagent/pkg/atomicfile"
	"github.com/meshagent/meshagent/pkg/pki"
)

// Files names what Write leaves in a directory.
const (
	CAFile = "ca.pem"
)

// CertFile and KeyFile name a server's certificate and key.
func CertFile(server string) string { return server + "-cert.pem" }

// KeyFile names a server's key file.
func KeyFile(server string) string { return server + "-key.pem" }

// Write makes dir/ca.pem and a certificate and key per server, valid for life. A CA
// already in dir is reused (its key stays in dir/ca-key.pem, 0600), so servers added
// later chain to the same CA; existing server files are replaced.
func Write(dir string, servers []string, life time.Duration, now time.Time) error {
	if len(servers) == 0 {
		return errors.New("bus tls: no servers")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("bus tls: %w", err)
	}
	ca, caKey, err := loadOrMakeCA(dir, life, now)
	if err != nil {
		return err
	}
	for _, s := range servers {
		if s == "" || filepath.Base(s) != s {
			return fmt.Errorf("bus tls: bad server name %q", s)
		}
		key, err := pki.GenerateKey(pki.ECP256)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{Organization: []string{"meshagent"}, CommonName: s},
			DNSNames:     []string{s, "localhost"},
			IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
			NotBefore:    now.Add(-time.Minute),
			NotAfter:     now.Add(life),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
		if err != nil {
			return fmt.Errorf("bus tls: issue %s: %w", s, err)
		}
		keyPEM, err := pki.EncodeKeyPEM(key, true)
		if err != nil {
			return err
		}
		cert, _ := x509.ParseCertificate(der)
		if err := atomicfile.Write(filepath.Join(dir, KeyFile(s)), keyPEM, 0o600); err != nil {
			return err
		}
		if err := atomicfile.Write(filepath.Join(dir, CertFile(s)), pki.EncodeCertPEM(cert), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func loadOrMakeCA(dir string, life time.Duration, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	certPath, keyPath := filepath.Join(dir, CAFile), filepath.Join(dir, "ca-key.pem")
	if c, err := os.ReadFile(certPath); err == nil {
		k, err := os.ReadFile(keyPath)
		if err != nil {
			return nil, nil, fmt.Errorf("bus tls: %s without its key: %w", certPath, err)
		}
		certs, err := pki.ParseCertsPEM(c)
		if err != nil || len(certs) != 1 {
			return nil, nil, fmt.Errorf("bus tls: %s: want one certificate (%v)", certPath, err)
		}
		key, err := pki.ParseKeyPEM(k)
		if err != nil {
			return nil, nil, fmt.Errorf("bus tls: %s: %w", keyPath, err)
		}
		return certs[0], key, nil
	}
	cert, key, err := MakeCA("meshagent bus CA", life, now)
	if err != nil {
		return nil, nil, fmt.Errorf("bus tls: %w", err)
	}
	keyPEM, err := pki.EncodeKeyPEM(key, true)
	if err != nil {
		return nil, nil, err
	}
	if err := atomicfile.Write(keyPath, keyPEM, 0o600); err != nil {
		return nil, nil, err
	}
	if err := atomicfile.Write(certPath, pki.EncodeCertPEM(cert), 0o644); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

// MakeCA makes a self-signed P-256 CA that signs end-entity certificates only
// (path length zero), valid for life from a minute before now. Its key is returned,
// never written: the caller decides where it may go.
func MakeCA(commonName string, life time.Duration, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"meshagent"}, CommonName: commonName},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(life),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("make CA %q: %w", commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n.Add(n, big.NewInt(1))
}
