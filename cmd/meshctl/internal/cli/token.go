package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"

	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/flagenv"
)

func runToken(_ context.Context, env Env, args []string) error {
	var dir, ns, sa, aud, pod, node string
	var ttl time.Duration
	fs := flagenv.New("token", env.Getenv)
	dirFlag(fs, &dir)
	fs.String(&ns, "ns", "POD_NAMESPACE", "", "namespace")
	fs.String(&sa, "sa", "SERVICE_ACCOUNT", "", "service account")
	fs.String(&pod, "pod", "POD_NAME", "", "bind the token to this pod, a name in -ns or <ns>/<name> (the signer then records certificates for it only)")
	fs.String(&node, "node", "NODE_NAME", "", "bind the token to this node too, as Kubernetes binds a pod's token to the node it runs on (the node tier admits a pod only on its node)")
	fs.String(&aud, "aud", "", devtoken.DefaultAudience, "audience")
	fs.Duration(&ttl, "ttl", "", time.Hour, "token lifetime")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	iss, err := devtoken.LoadOrCreate(filepath.Join(dir, "issuer"))
	if err != nil {
		return err
	}
	if pod != "" {
		p, err := mintPod(ns, pod)
		if err != nil {
			return fmt.Errorf("-pod: %w", err)
		}
		pod = p.Name
	}
	tok, err := iss.MintForPodOnNode(ns, sa, pod, node, aud, ttl, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintln(env.Stdout, tok)
	return nil
}
