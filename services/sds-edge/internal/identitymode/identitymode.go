// Package identitymode chooses how sds-edge gets the pod's identity, as Istio's agent
// decides: another provider's healthy socket, mounted certificate files, or the CA.
package identitymode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/udsock"
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

// Decide chooses the mode. A socket something answers on means another provider
// owns the pod's identity (external mode); it is probed every 100ms on clk until
// o.ExternalWait has passed.
func Decide(ctx context.Context, o Options, clk clock.Clock, log hclog.Logger) (Decision, error) {
	deadline := clk.Now().Add(o.ExternalWait)
	for {
		healthy, err := probe(ctx, o.Socket, log)
		if err != nil {
			return Decision{}, err
		}
		if healthy {
			return Decision{Mode: External}, nil
		}
		if !clk.Now().Before(deadline) {
			break
		}
		if !backoff.Wait(ctx, clk, 100*time.Millisecond) {
			return Decision{}, ctx.Err()
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

// probe reports whether something answers on the socket. A socket file nothing
// answers on is left for udsock.Listen, which replaces it.
func probe(ctx context.Context, path string, log hclog.Logger) (bool, error) {
	live, err := udsock.Live(ctx, path)
	if err != nil {
		return false, fmt.Errorf("-socket: %w", err)
	}
	if live {
		log.Info("an sds server already answers on the socket: not serving", "socket", path)
	}
	return live, nil
}

func hasCerts(dir string) bool {
	for _, f := range []string{"cert-chain.pem", "key.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return false
		}
	}
	return true
}
