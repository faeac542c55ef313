package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/democp"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/obs"
)

// runKubelet plays the Kubernetes parts a pod relies on outside meshctl up (in
// docker compose): it keeps the dev issuer's key and JWKS in a directory the signers
// read, and keeps a pod's projected service-account token fresh.
func runKubelet(ctx context.Context, env Env, args []string) error {
	var issuerDir, tokenFile, ns, sa, pod string
	var ttl, refresh time.Duration
	fs := flagenv.New("kubelet", env.Getenv)
	fs.String(&issuerDir, "issuer-dir", "ISSUER_DIR", "", "directory of the issuer key and jwks.json (created if empty)")
	fs.String(&tokenFile, "token-file", "TOKEN_FILE", "", "token file to keep fresh")
	fs.String(&ns, "ns", "POD_NAMESPACE", "default", "namespace of the token")
	fs.String(&sa, "sa", "SERVICE_ACCOUNT", "default", "service account of the token")
	fs.String(&pod, "pod", "POD_NAME", "", "pod the token is bound to (empty: none)")
	fs.Duration(&ttl, "ttl", "TOKEN_TTL", time.Hour, "token lifetime")
	fs.Duration(&refresh, "refresh", "TOKEN_REFRESH", 30*time.Minute, "how often to mint a new token")
	if err := parse(fs, env, args); err != nil {
		return err
	}
	var errs []error
	if issuerDir == "" {
		errs = append(errs, errors.New("-issuer-dir: required"))
	}
	if tokenFile == "" {
		errs = append(errs, errors.New("-token-file: required"))
	}
	if refresh <= 0 || refresh >= ttl {
		errs = append(errs, errors.New("-refresh: must be positive and shorter than -ttl"))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	iss, err := devtoken.LoadOrCreate(issuerDir)
	if err != nil {
		return err
	}
	write := func() error {
		tok, err := iss.MintForPod(ns, sa, pod, devtoken.DefaultAudience, ttl, time.Now())
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(tokenFile), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(tokenFile+".tmp", []byte(tok), 0o600); err != nil {
			return err
		}
		return os.Rename(tokenFile+".tmp", tokenFile)
	}
	t := time.NewTicker(refresh)
	defer t.Stop()
	for {
		if err := write(); err != nil {
			return fmt.Errorf("write token: %w", err)
		}
		fmt.Fprintf(env.Stdout, "token for %s/%s written to %s\n", ns, sa, tokenFile)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// runControlPlane runs the demo xDS server on its own, for docker compose.
func runControlPlane(ctx context.Context, env Env, args []string) error {
	var cfg democp.Config
	var nodes string
	var logc obs.LogConfig
	fs := flagenv.New("controlplane", env.Getenv)
	logc.Bind(fs)
	fs.String(&cfg.Addr, "addr", "XDS_ADDR", "127.0.0.1:18000", "listen address of the xDS server")
	fs.String(&nodes, "nodes", "XDS_NODES", "", "node ids to serve, comma-separated (empty: every node)")
	if err := parse(fs, env, args); err != nil {
		return err
	}
	if err := logc.Validate(); err != nil {
		return err
	}
	cfg.NodeIDs = splitList(nodes)
	var log hclog.Logger = obs.NewLogger("controlplane", logc, env.Stderr)
	return democp.New(cfg, log).Run(ctx)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
