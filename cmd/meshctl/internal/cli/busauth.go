package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"

	"github.com/meshagent/meshagent/pkg/atomicfile"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/flagenv"
)

// runBusAuth generates (once; existing seeds are kept) a fleet's bus credential set
// and writes the nats-server configuration of the role table for it.
func runBusAuth(_ context.Context, env Env, args []string) error {
	var out string
	fs := flagenv.New("bus-auth", env.Getenv)
	fs.String(&out, "out", "", "", "directory for the seeds (0600) and nats-auth.conf (required)")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	if out == "" {
		return errors.New("-out: required")
	}
	creds, err := policy.LoadOrGenerate(out)
	if err != nil {
		return err
	}
	conf, err := policy.Render(creds.Keys)
	if err != nil {
		return err
	}
	path := filepath.Join(out, "nats-auth.conf")
	if err := atomicfile.Write(path, []byte(conf), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "server config   %s (include it in nats-server.conf)\n", path)
	for _, r := range policy.Users {
		fmt.Fprintf(env.Stdout, "%-15s %s  %s\n", r, creds.SeedFile(r), creds.Keys.Users[r])
	}
	fmt.Fprintf(env.Stdout, "%-15s %s  %s\n", "callout issuer", creds.IssuerFile(), creds.Keys.Issuer)
	return nil
}
