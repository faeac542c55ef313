// Package compose is the docker compose stack's plumbing that meshctl's image runs
// (deploy/compose/compose.yaml): the secrets init container, the kubelet stand-in
// and the demo control plane on its own. They are development-stack commands, listed
// apart from the operator's in meshctl -h.
package compose

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/composesecrets"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/democp"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/kubelet"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/obs"
)

// Commands are the compose stack's commands, in the order meshctl -h lists them.
var Commands = []command.Command{
	{Name: "compose-secrets", Usage: "make the compose stack's credentials, one directory per holder: compose-secrets -state DIR -out DIR", Run: runSecrets},
	{Name: "kubelet", Usage: "keep a pod's service-account token fresh: kubelet -issuer-dir D -token-file F", Run: runKubelet},
	{Name: "controlplane", Usage: "run the demo xDS control plane on its own: controlplane -addr HOST:PORT", Run: runControlPlane},
}

// runKubelet plays the Kubernetes parts a pod relies on outside meshctl up: it
// keeps the dev issuer's key and JWKS in a directory the signers read, and keeps a
// pod's projected service-account token fresh.
func runKubelet(ctx context.Context, env command.Env, args []string) error {
	var issuerDir string
	var ttl, refresh time.Duration
	var tok kubelet.Token
	fs := flagenv.New("kubelet", env.Getenv)
	fs.String(&issuerDir, "issuer-dir", "ISSUER_DIR", "", "directory of the issuer key and jwks.json (created if empty)")
	fs.String(&tok.File, "token-file", "TOKEN_FILE", "", "token file to keep fresh")
	fs.String(&tok.Namespace, "ns", "POD_NAMESPACE", "default", "namespace of the token")
	fs.String(&tok.ServiceAccount, "sa", "SERVICE_ACCOUNT", "default", "service account of the token")
	fs.String(&tok.Pod, "pod", "POD_NAME", "", "pod the token is bound to (empty: none)")
	fs.String(&tok.Node, "node", "NODE_NAME", "", "node the pod is scheduled on, bound into the token as Kubernetes does (empty: none)")
	fs.Duration(&ttl, "ttl", "TOKEN_TTL", time.Hour, "token lifetime")
	fs.Duration(&refresh, "refresh", "TOKEN_REFRESH", 30*time.Minute, "how often to mint a new token")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	var errs []error
	if issuerDir == "" {
		errs = append(errs, errors.New("-issuer-dir: required"))
	}
	if tok.File == "" {
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
	k := &kubelet.Kubelet{Issuer: iss, TTL: ttl, Tokens: []kubelet.Token{tok}, Report: func(t kubelet.Token, err error) {
		if err != nil {
			fmt.Fprintf(env.Stderr, "token for %s/%s: %v\n", t.Namespace, t.ServiceAccount, err)
			return
		}
		fmt.Fprintf(env.Stdout, "token for %s/%s written to %s\n", t.Namespace, t.ServiceAccount, t.File)
	}}
	if err := k.WriteAll(time.Now()); err != nil {
		return err // the first token: without it the pod cannot start
	}
	k.Run(ctx, refresh)
	return nil
}

// runControlPlane runs the demo xDS server on its own.
func runControlPlane(ctx context.Context, env command.Env, args []string) error {
	var cfg democp.Config
	var logc obs.LogConfig
	fs := flagenv.New("controlplane", env.Getenv)
	logc.Bind(fs)
	fs.String(&cfg.Addr, "addr", "XDS_ADDR", "127.0.0.1:18000", "listen address of the xDS server")
	fs.List(&cfg.NodeIDs, "nodes", "XDS_NODES", nil, "node ids to serve, comma-separated (empty: every node)")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	if err := logc.Validate(); err != nil {
		return err
	}
	return democp.New(cfg, obs.NewLogger("controlplane", logc, env.Stderr)).Run(ctx)
}

// runSecrets is the compose stack's init container: it makes (once) the bus
// credentials, the bus TLS material and the CA KEK, and gives each holder its part.
func runSecrets(_ context.Context, env command.Env, args []string) error {
	c := composesecrets.Config{Now: time.Now()}
	fs := flagenv.New("compose-secrets", env.Getenv)
	fs.String(&c.State, "state", "SECRETS_STATE", "", "the generator's own directory: every seed, the bus CA key and the KEK (required)")
	fs.String(&c.Out, "out", "SECRETS_OUT", "", "parent of the holders' directories: signer, rotator, pod, host, kubelet, jwks and one per server (required)")
	fs.List(&c.Servers, "servers", "NATS_SERVERS", []string{"nats-1", "nats-2", "nats-3"}, "NATS server names, comma-separated")
	fs.Duration(&c.TLSLife, "tls-life", "", 365*24*time.Hour, "lifetime of the bus CA and server certificates")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	if err := composesecrets.Write(c); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "compose secrets in %s: %s, %s, %s, %s, %s, %s, %s\n", c.Out, composesecrets.SignerDir,
		composesecrets.RotatorDir, composesecrets.PodDir, composesecrets.HostDir, composesecrets.KubeletDir, composesecrets.JWKSDir, strings.Join(c.Servers, ", "))
	return nil
}
