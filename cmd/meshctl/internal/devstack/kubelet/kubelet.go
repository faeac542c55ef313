// Package kubelet plays the kubelet's part for the demo pods of the development
// stack (meshctl up, and docker compose's kubelet container): it keeps each pod's
// projected service-account token file fresh, minted by the dev token issuer
// (pkg/devtoken) as the Kubernetes API server would.
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/meshagent/meshagent/pkg/atomicfile"
	"github.com/meshagent/meshagent/pkg/devtoken"
)

// Token is one pod's projected token.
type Token struct {
	File           string // where the pod reads it
	Namespace      string
	ServiceAccount string
	Pod            string // the pod the token is bound to; empty: none
	Node           string // the node that pod is scheduled on; empty: none
}

// Kubelet writes the tokens.
type Kubelet struct {
	Issuer *devtoken.Issuer
	TTL    time.Duration // each token's lifetime
	Tokens []Token
	// Report, when set, is told the outcome of each write.
	Report func(t Token, err error)
}

// WriteAll writes a fresh token into each token file (0600, atomically, its
// directory made if missing), reports each, and returns every failure.
func (k *Kubelet) WriteAll(now time.Time) error {
	var errs []error
	for _, t := range k.Tokens {
		err := k.Write(t, now)
		if k.Report != nil {
			k.Report(t, err)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Write writes a fresh token into t's file.
func (k *Kubelet) Write(t Token, now time.Time) error {
	tok, err := k.Issuer.MintForPodOnNode(t.Namespace, t.ServiceAccount, t.Pod, t.Node, devtoken.DefaultAudience, k.TTL, now)
	if err != nil {
		return fmt.Errorf("token for %s/%s: %w", t.Namespace, t.ServiceAccount, err)
	}
	if err := os.MkdirAll(filepath.Dir(t.File), 0o755); err != nil {
		return fmt.Errorf("token dir: %w", err)
	}
	return atomicfile.Write(t.File, []byte(tok), 0o600)
}

// Run rewrites every token each period until ctx ends. A failed write is reported
// and tried again at the next period: the token already there stays valid until
// its TTL, so a period shorter than the TTL leaves room for retries.
func (k *Kubelet) Run(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			_ = k.WriteAll(now)
		}
	}
}
