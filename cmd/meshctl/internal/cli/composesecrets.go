package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/composesecrets"
	"github.com/meshagent/meshagent/pkg/flagenv"
)

// runComposeSecrets is the compose stack's init container: it makes (once) the bus
// credentials, the bus TLS material and the CA KEK, and gives each holder its part.
func runComposeSecrets(_ context.Context, env Env, args []string) error {
	c := composesecrets.Config{Now: time.Now()}
	var servers string
	fs := flagenv.New("compose-secrets", env.Getenv)
	fs.String(&c.State, "state", "SECRETS_STATE", "", "the generator's own directory: every seed, the bus CA key and the KEK (required)")
	fs.String(&c.Out, "out", "SECRETS_OUT", "", "parent of the holders' directories: signer, rotator, pod, host, kubelet, jwks and one per server (required)")
	fs.String(&servers, "servers", "NATS_SERVERS", "nats-1,nats-2,nats-3", "NATS server names, comma-separated")
	fs.Duration(&c.TLSLife, "tls-life", "", 365*24*time.Hour, "lifetime of the bus CA and server certificates")
	if err := parse(fs, env, args); err != nil {
		return err
	}
	for _, s := range strings.Split(servers, ",") {
		if s = strings.TrimSpace(s); s != "" {
			c.Servers = append(c.Servers, s)
		}
	}
	if err := composesecrets.Write(c); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "compose secrets in %s: %s, %s, %s, %s, %s, %s, %s\n", c.Out, composesecrets.SignerDir,
		composesecrets.RotatorDir, composesecrets.PodDir, composesecrets.HostDir, composesecrets.KubeletDir, composesecrets.JWKSDir, strings.Join(c.Servers, ", "))
	return nil
}
