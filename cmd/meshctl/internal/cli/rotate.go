package cli

import (
	"context"
	"fmt"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/inventory"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/nats-io/nats.go"
)

func runRotate(ctx context.Context, env Env, args []string) error {
	var dir string
	var newKey bool
	var wait time.Duration
	var bf busFlags
	fs := flagenv.New("rotate", env.Getenv)
	dirFlag(fs, &dir)
	bf.bind(fs)
	fs.Bool(&newKey, "new-key", "", false, "rotate root: generate a new root key instead of re-signing the current one")
	fs.Duration(&wait, "wait", "", 0, "rotate root: follow the fleet (from the inventory) until every pod holds the new root, at most this long")
	words, err := parseWords(fs, args)
	if err != nil {
		return err
	}
	usage := fmt.Errorf("%w: meshctl rotate root [-new-key] [-wait D] | meshctl rotate pod ID", errUsage)
	switch {
	case len(words) == 1 && words[0] == "root":
	case len(words) == 2 && words[0] == "pod" && !newKey:
	default:
		return usage
	}
	st, err := bf.stackFor(dir)
	if err != nil {
		return err
	}
	nc, err := bf.connect(ctx, st, "meshctl rotate")
	if err != nil {
		return err
	}
	defer nc.Close()
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if words[0] == "pod" {
		return rotatePod(nc, env, words[1])
	}
	msg, err := events.NewMsg(events.SubjectRootRotate, "meshctl", events.RotateRequest{NewKey: newKey, Reason: "meshctl rotate root"})
	if err != nil {
		return err
	}
	resp, err := nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return fmt.Errorf("rotate root: %w", err)
	}
	reply, _, err := events.Decode[events.RotateReply](resp)
	if err != nil {
		return fmt.Errorf("rotate reply: %w", err)
	}
	if reply.Error != nil {
		return fmt.Errorf("signer refused: %w", reply.Error)
	}
	fmt.Fprintf(env.Stdout, "new root sha256 %s; bundle now holds %d root(s)\n", reply.Fingerprint, len(reply.Roots))
	if wait <= 0 {
		return nil
	}
	return followRoot(parent, nc, env, reply.Fingerprint, wait)
}

// parseWords parses a command's flags and returns its words: flags may stand
// before, between or after them (rotate -dir D pod ID, inspect demo-0 -dir D).
func parseWords(fs *flagenv.Set, args []string) ([]string, error) {
	fs.AllowArgs()
	var words []string
	rest := args
	for {
		if err := command.Parse(fs, rest); err != nil {
			return nil, err
		}
		rest = fs.FS.Args()
		if len(rest) == 0 {
			return words, nil
		}
		words, rest = append(words, rest[0]), rest[1:]
	}
}

// followRoot reports, from the inventory, how many pods hold a certificate under the
// new root, until all do or wait runs out.
func followRoot(ctx context.Context, nc *nats.Conn, env Env, fp string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for {
		snap, err := inventory.Read(ctx, nc)
		if err == nil {
			held, total := 0, 0
			for _, c := range snap.Certs {
				if c.Down || c.Pod == "" {
					continue
				}
				total++
				if c.Root == fp {
					held++
				}
			}
			line := fmt.Sprintf("%d/%d pod certificate(s) under the new root", held, total)
			if line != last {
				fmt.Fprintf(env.Stdout, "%s  %s\n", time.Now().Format("15:04:05"), line)
				last = line
			}
			if held == total {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("rotate root -wait: %w", err)
			}
			return fmt.Errorf("rotate root -wait: after %s, %s", wait, last)
		case <-tick.C:
		}
	}
}

func rotatePod(nc *nats.Conn, env Env, pod string) error {
	subj, err := events.PodRenewSubject(pod)
	if err != nil {
		return err
	}
	// Only the renew command: renew_sent is the rotator's record, not the operator's
	// (the bus refuses it from the admin role); the pod's new cert.issued shows it.
	msg, err := events.NewMsg(subj, "meshctl", events.RenewDue{Pod: pod, Resource: "default", Reason: events.RenewForced})
	if err != nil {
		return err
	}
	if err := nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("publish %s: %w", subj, err)
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	if err := nc.LastError(); err != nil {
		return fmt.Errorf("publish %s: %w", subj, err)
	}
	fmt.Fprintf(env.Stdout, "renew-due sent to pod %s on %s\n", pod, subj)
	return nil
}
