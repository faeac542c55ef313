package cli

import (
	"context"
	"fmt"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stack"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/nats-io/nats.go"
)

func runEvents(ctx context.Context, env Env, args []string) error {
	var dir, url string
	fs := flagenv.New("events", env.Getenv)
	dirFlag(fs, &dir)
	fs.String(&url, "nats-url", "NATS_URL", "", "NATS URL (default: the one in stack.json)")
	if err := parse(fs, env, args); err != nil {
		return err
	}
	if url == "" {
		st, err := stack.Read(dir)
		if err != nil {
			return err
		}
		url = st.NATSURL
	}
	nc, err := nats.Connect(url, nats.Name("meshctl events"))
	if err != nil {
		return fmt.Errorf("connect %s: %w", url, err)
	}
	defer nc.Close()
	if _, err := nc.Subscribe(events.EventsWildcard, printer(func(line string) { fmt.Fprintln(env.Stdout, line) })); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
