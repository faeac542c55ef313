// Package startup decides how sds-edge gets the pod's identity, as Istio's agent
// decides: another provider's healthy socket, mounted certificate files, or the CA.
package startup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Modes, as published in pod.up.
const (
	External = "external" // another SDS server owns the socket
	File     = "file"     // serve mounted certificate files
	CA       = "ca"       // get certificates from the CA
)

// Options are the inputs of the decision.
type Options struct {
	Socket         string
	ExternalWait   time.Duration
	CredentialsDir string // workload-spiffe-credentials
	FileMounted    bool
	FileMountedDir string // etc/certs
}

// Decision is the chosen mode; Dir holds the certificate files in File mode.
type Decision struct {
	Mode string
	Dir  string
}

// Decide chooses the mode. A socket file nothing answers on is removed.
func Decide(ctx context.Context, o Options, log hclog.Logger) (Decision, error) {
	deadline := time.Now().Add(o.ExternalWait)
	for {
		healthy, err := probe(ctx, o.Socket, log)
		if err != nil {
			return Decision{}, err
		}
		if healthy {
			return Decision{Mode: External}, nil
		}
		if time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return Decision{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if hasCerts(o.CredentialsDir) {
		return Decision{Mode: File, Dir: o.CredentialsDir}, nil
	}
	if o.FileMounted {
		if !hasCerts(o.FileMountedDir) {
			return Decision{}, fmt.Errorf("-file-mounted-certs: no cert-chain.pem and key.pem in %s", o.FileMountedDir)
		}
		return Decision{Mode: File, Dir: o.FileMountedDir}, nil
	}
	return Decision{Mode: CA}, nil
}

// probe reports whether something answers on the socket; a dead socket file is removed.
func probe(ctx context.Context, path string, log hclog.Logger) (bool, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("check socket %s: %w", path, err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return false, fmt.Errorf("-socket: %s exists and is not a socket", path)
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(dctx, "unix", path)
	if err == nil {
		c.Close()
		log.Info("an sds server already answers on the socket: not serving", "socket", path)
		return true, nil
	}
	log.Info("removing stale socket", "socket", path, "error", err)
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("remove stale socket: %w", err)
	}
	return false, nil
}

func hasCerts(dir string) bool {
	for _, f := range []string{"cert-chain.pem", "key.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return false
		}
	}
	return true
}
