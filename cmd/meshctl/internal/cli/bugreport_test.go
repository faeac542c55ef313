package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestBugReportFailsOnlyFailedSteps: a step that writes a note on stderr and
// succeeds, or that reports findings by exiting non-zero with its output
// written (status's "needs attention"), did not fail: the bundle says "some steps
// failed" only for a step that returned an error without its output.
func TestBugReportFailsOnlyFailedSteps(t *testing.T) {
	noted := func(_ context.Context, env Env, _ []string) error {
		fmt.Fprintln(env.Stdout, "FLEET")
		fmt.Fprintln(env.Stderr, "meshctl: 5 certificate(s) of meshctl bench left out")
		return nil
	}
	findings := func(_ context.Context, env Env, _ []string) error {
		fmt.Fprintln(env.Stdout, "NEEDS ATTENTION")
		return errors.New("1 thing(s) need attention")
	}
	broken := func(context.Context, Env, []string) error { return errors.New("operator at http://x unreachable") }
	b := &bundle{}
	b.run(context.Background(), Env{}, reportStep{file: "certs.txt", run: noted}, nil)
	b.run(context.Background(), Env{}, reportStep{file: "status.txt", run: findings, findings: true}, nil)
	if note := b.note(); note != "" {
		t.Fatalf("healthy steps reported as %q (errors: %s)", note, b.errs.String())
	}
	if !strings.Contains(b.notes.String(), "bench left out") || !strings.Contains(b.notes.String(), "need attention") {
		t.Fatalf("notes.txt lacks what the steps said: %q", b.notes.String())
	}
	b.run(context.Background(), Env{}, reportStep{file: "check.txt", run: broken, findings: true}, nil)
	if !strings.Contains(b.note(), "some steps failed") || !strings.Contains(b.errs.String(), "check.txt: operator at http://x unreachable") {
		t.Fatalf("a failed step: note %q, errors %q", b.note(), b.errs.String())
	}
}
