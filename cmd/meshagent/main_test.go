package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/pkg/flagenv"
)

func noEnv(string) string { return "" }

func TestRunRejectsAMissingOrUnknownRole(t *testing.T) {
	for args, want := range map[string]string{"": "no role given", "signer": `unknown role "signer"`} {
		err := run(context.Background(), strings.Fields(args), noEnv)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "usage: meshagent") {
			t.Errorf("run(%q) = %v, want %q and the usage", args, err, want)
		}
	}
}

// Each role is its service package's Load: its own flags, its own validation.
func TestRolesAreTheServicesOwnConfig(t *testing.T) {
	for role, flag := range map[string]string{"sds-edge": "-socket", "xds-relay": "-discovery-address", "launcher": "-sds-ready-url"} {
		err := run(context.Background(), []string{role, "-h"}, noEnv)
		var b strings.Builder
		if !flagenv.PrintHelp(err, &b) || !strings.Contains(b.String(), flag) {
			t.Errorf("%s -h: %v, help lacks %s:\n%s", role, err, flag, b.String())
		}
	}
	err := run(context.Background(), []string{"launcher", "-pod", "web-0", "-sds-ready-url", "ftp://x"}, noEnv)
	if err == nil || !strings.Contains(err.Error(), "-sds-ready-url") {
		t.Fatalf("launcher with a bad flag: %v", err)
	}
}

func TestPodArgumentsSplitByRole(t *testing.T) {
	got, err := splitPod([]string{"--launcher", "-pod", "a", "--sds-edge", "--xds-relay", "-pod", "b", "-x"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got["launcher"], " ") != "-pod a" || len(got["sds-edge"]) != 0 || strings.Join(got["xds-relay"], " ") != "-pod b -x" {
		t.Fatalf("split = %q", got)
	}
	for args, want := range map[string]string{
		"-pod a --sds-edge --xds-relay --launcher":            `"-pod" before the first role marker`,
		"--sds-edge --xds-relay":                              "missing --launcher",
		"--sds-edge --xds-relay --launcher --sds-edge -pod a": "--sds-edge given twice",
	} {
		if _, err := splitPod(strings.Fields(args)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("splitPod(%q) = %v, want %q", args, err, want)
		}
	}
}

// In pod mode a role that cannot start stops the pod, and the error names the role.
func TestPodModeNamesTheRoleThatFailed(t *testing.T) {
	err := run(context.Background(), strings.Fields("pod --sds-edge -pod web-0 -key-alg DSA --xds-relay -pod web-0 --launcher -pod web-0"), noEnv)
	if err == nil || !strings.HasPrefix(err.Error(), "sds-edge: ") || !strings.Contains(err.Error(), "-key-alg") {
		t.Fatalf("run pod = %v", err)
	}
	if errors.Is(err, context.Canceled) {
		t.Fatal("cancellation reported as the failure")
	}
}

// meshagent -h is help (printed on stdout, exit 0), not an unknown role (issue 29:
// it exited 1).
func TestHelpIsNotAnUnknownRole(t *testing.T) {
	for _, arg := range []string{"-h", "--help", "help"} {
		err := run(context.Background(), []string{arg}, noEnv)
		var b strings.Builder
		if !flagenv.PrintHelp(err, &b) || !strings.Contains(b.String(), "usage: meshagent") || !strings.Contains(b.String(), "version") {
			t.Errorf("meshagent %s: %v\n%s", arg, err, b.String())
		}
	}
}
