package devstack

import (
	"crypto/tls"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/bustls"
)

// busTLSLife is how long the local bus's CA and server certificate are valid.
const busTLSLife = 5 * 365 * 24 * time.Hour

// busTLS is the local bus's TLS: a bus CA made on the first start (Dir/secrets/bus-tls,
// reused after) and a server certificate for loopback. The server asks every TLS
// client for a certificate and requires none: a pod with no token (a VM) presents
// its mesh certificate, which the signer's auth callout checks. The stack's own
// services stay on plaintext loopback (AllowNonTLS). It returns the CA file clients
// verify the server with.
func busTLS(dir string) (*tls.Config, string, error) {
	tlsDir := filepath.Join(dir, "secrets", "bus-tls")
	if err := bustls.Write(tlsDir, []string{"nats"}, busTLSLife, time.Now()); err != nil {
		return nil, "", err
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(tlsDir, bustls.CertFile("nats")), filepath.Join(tlsDir, bustls.KeyFile("nats")))
	if err != nil {
		return nil, "", fmt.Errorf("bus tls: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS12},
		filepath.Join(tlsDir, bustls.CAFile), nil
}

// natsURL is the local bus in plaintext, as the stack's services and commands reach
// it on loopback (the server's ClientURL says tls:// once it has TLS).
func (r *Runner) natsURL() string {
	return "nats://" + strings.TrimPrefix(strings.TrimPrefix(r.ns.ClientURL(), "tls://"), "nats://")
}
