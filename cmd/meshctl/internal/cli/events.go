package cli

import (
	"context"
	"fmt"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
)

func runEvents(ctx context.Context, env Env, args []string) error {
	var dir string
	var bf busFlags
	fs := flagenv.New("events", env.Getenv)
	dirFlag(fs, &dir)
	bf.bind(fs)
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	st, err := bf.stackFor(dir)
	if err != nil {
		return err
	}
	nc, err := bf.connect(ctx, st, "meshctl events")
	if err != nil {
		return err
	}
	defer nc.Close()
	if _, err := nc.Subscribe(events.EventsWildcard, printer(func(line string) { fmt.Fprintln(env.Stdout, line) })); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
