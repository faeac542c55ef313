package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/pkg/events"

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
	fs.String(&pod, "pod", "", "", "pod from stack.json, <namespace>/<name> or a name in default (instead of -socket)")
	fs.String(&node, "node", "", "meshctl", "node id to present")
	fs.AllowArgs()
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	names := fs.FS.Args()
	if socket == "" {
		if pod == "" {
			return errors.New("-socket or -pod is required")
		}
		want, err := parsePod(pod)
		if err != nil {
			return fmt.Errorf("-pod: %w", err)
		}
		p, err := stackPod(dir, func(p stackfile.Pod) bool {
			return p.ID == want.Name && cmp.Or(p.Namespace, events.DefaultNamespace) == want.Namespace
		})
		if err != nil {
			return err
		}
		if p == nil || p.SDSSocket == "" {
			return fmt.Errorf("no pod %q in stack.json", pod)
		}
		socket = p.SDSSocket
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cc, err := sdsclient.DialUnix(ctx, socket)
	if err != nil {
		return err
	}
	defer cc.Close()
	if len(names) > 0 {
		secrets, err := sdsclient.Fetch(ctx, cc, node, names...)
		if err != nil {
			return fmt.Errorf("fetch %v: %w", names, err)
		}
		return printSecrets(env.Stdout, names, secrets)
	}
	return printServed(ctx, env.Stdout, cc, node)
}

// printServed prints every resource the pod serves a workload (what a user asks
// `meshctl sds -pod X` for): default, ROOTCA and ROOTCA_SPIFFE, each fetched on
// its own so that one the pod does not hold is said so beside the others. File
// resources are served only under their paths, so only when named.
func printServed(ctx context.Context, w io.Writer, cc grpc.ClientConnInterface, node string) error {
	var failed []string
	for _, n := range sdsclient.WorkloadResources {
		secrets, err := sdsclient.Fetch(ctx, cc, node, n)
		if err != nil {
			fmt.Fprintf(w, "%-10s (not served: %v)\n", n, status.Convert(errors.Unwrap(err)).Message())
			failed = append(failed, n)
			continue
		}
		if err := printSecrets(w, []string{n}, secrets); err != nil {
			return err
		}
	}
	if len(failed) == len(sdsclient.WorkloadResources) {
		return fmt.Errorf("the pod serves none of %v", sdsclient.WorkloadResources)
	}
	return nil
}

// printSecrets prints each named secret: a certificate's identity, serial and
// expiry (never its key), each root of a validation context, and each trust
// domain's roots of the SPIFFE validator (ROOTCA_SPIFFE).
func printSecrets(w io.Writer, names []string, secrets map[string]sdsclient.Secret) error {
	roots := func(name, label string, pemData []byte) error {
		cs, err := pki.ParseCertsPEM(pemData)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", name, label, err)
		}
		for _, c := range cs {
			fmt.Fprintf(w, "%-10s %sroot %s sha256 %s expires %s\n", name, label, c.Subject, pki.Fingerprint(c)[:16], c.NotAfter.Format(time.RFC3339))
		}
		return nil
	}
	for _, n := range names {
		s, ok := secrets[n]
		switch {
		case !ok:
			fmt.Fprintf(w, "%-10s (not returned)\n", n)
		case s.IsCertificate():
			cs, err := pki.ParseCertsPEM(s.CertChain)
			if err != nil {
				return fmt.Errorf("%s: %w", n, err)
			}
			id := "-"
			if len(cs[0].URIs) > 0 {
				id = cs[0].URIs[0].String()
			}
			fmt.Fprintf(w, "%-10s %s serial %s expires %s (key present, not shown)\n", n, id, pki.SerialHex(cs[0]), cs[0].NotAfter.Format(time.RFC3339))
		case s.SPIFFE != nil:
			if len(s.SPIFFE) == 0 {
				fmt.Fprintf(w, "%-10s SPIFFE validator with no trust domain\n", n)
			}
			for _, td := range s.SPIFFE {
				if err := roots(n, "trust domain "+td.Name+" ", td.Bundle); err != nil {
					return err
				}
			}
		case s.IsValidationContext():
			if err := roots(n, "", s.TrustedCA); err != nil {
				return err
			}
		default:
			fmt.Fprintf(w, "%-10s (empty)\n", n)
		}
	}
	return nil
}
