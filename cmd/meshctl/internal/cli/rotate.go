package cli

import (
	"context"
	"fmt"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/nats-io/nats.go"
)

func runRotate(ctx context.Context, env Env, args []string) error {
	var dir string
	var newKey bool
	var bf busFlags
	fs := flagenv.New("rotate", env.Getenv)
	dirFlag(fs, &dir)
	bf.bind(fs)
	fs.AllowArgs()
	fs.Bool(&newKey, "new-key", "", false, "rotate root: generate a new root key instead of re-signing the current one")
	// Flags may stand before, between or after the words (rotate -dir D pod ID).
	var words []string
	rest := args
	for {
		if err := command.Parse(fs, rest); err != nil {
			return err
		}
		rest = fs.FS.Args()
		if len(rest) == 0 {
			break
		}
		words, rest = append(words, rest[0]), rest[1:]
	}
	usage := fmt.Errorf("%w: meshctl rotate root [-new-key] | meshctl rotate pod ID", errUsage)
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
	return nil
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
