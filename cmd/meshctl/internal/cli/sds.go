package cli

import (
	"context"
	"errors"
	"fmt"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
)

// runSDS fetches secrets from an SDS socket with FetchSecrets, as a quick check that
// a pod serves what it should. Private keys are never printed.
func runSDS(ctx context.Context, env Env, args []string) error {
	var dir, socket, pod, node string
	fs := flagenv.New("sds", env.Getenv)
	dirFlag(fs, &dir)
	fs.String(&socket, "socket", "", "", "SDS socket path")
	fs.String(&pod, "pod", "", "", "pod id from stack.json (instead of -socket)")
	fs.String(&node, "node", "", "meshctl", "node id to present")
	names := []string{"default", "ROOTCA"}
	fs.AllowArgs()
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	if fs.FS.NArg() > 0 {
		names = fs.FS.Args()
	}
	if socket == "" {
		if pod == "" {
			return errors.New("-socket or -pod is required")
		}
		st, err := stackfile.Read(dir)
		if err != nil {
			return err
		}
		for _, p := range st.Pods {
			if p.ID == pod {
				socket = p.SDSSocket
			}
		}
		if socket == "" {
			return fmt.Errorf("no pod %q in stack.json", pod)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cc, err := sdsclient.DialUnix(ctx, socket)
	if err != nil {
		return err
	}
	defer cc.Close()
	secrets, err := sdsclient.Fetch(ctx, cc, node, names...)
	if err != nil {
		return fmt.Errorf("fetch %v: %w", names, err)
	}
	for _, n := range names {
		s, ok := secrets[n]
		if !ok {
			fmt.Fprintf(env.Stdout, "%-10s (not returned)\n", n)
			continue
		}
		if s.IsCertificate() {
			cs, err := pki.ParseCertsPEM(s.CertChain)
			if err != nil {
				return err
			}
			id := "-"
			if len(cs[0].URIs) > 0 {
				id = cs[0].URIs[0].String()
			}
			fmt.Fprintf(env.Stdout, "%-10s %s serial %s expires %s (key present, not shown)\n", n, id, pki.SerialHex(cs[0]), cs[0].NotAfter.Format(time.RFC3339))
			continue
		}
		cs, err := pki.ParseCertsPEM(s.TrustedCA)
		if err != nil {
			return err
		}
		for _, c := range cs {
			fmt.Fprintf(env.Stdout, "%-10s root %s sha256 %s expires %s\n", n, c.Subject, pki.Fingerprint(c)[:16], c.NotAfter.Format(time.RFC3339))
		}
	}
	return nil
}
