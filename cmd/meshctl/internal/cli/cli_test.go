package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack/compose"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/flagenv"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := Run(context.Background(), Env{Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}, args)
	return out.String(), err
}

func TestBadInvocationsGiveClearErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"rotate without target", []string{"rotate"}, "meshctl rotate root"},
		{"rotate pod without id", []string{"rotate", "pod"}, "meshctl rotate pod [NAMESPACE/]NAME"},
		{"rotate pod with -new-key", []string{"rotate", "-dir", dir, "pod", "p", "-new-key"}, "meshctl rotate root [-new-key]"},
		{"rotate root with extra words", []string{"rotate", "root", "now"}, "meshctl rotate root"},
		{"rotate with flags first reaches the stack", []string{"rotate", "-dir", dir, "pod", "demo-0"}, "is meshctl up running?"},
		{"sign without a stack", []string{"sign", "-dir", dir, "-ns", "a", "-sa", "b"}, "is meshctl up running?"},
		{"status without a stack", []string{"status", "-dir", dir}, "is meshctl up running?"},
		{"token without sa", []string{"token", "-dir", dir, "-ns", "a"}, "namespace and service account are required"},
		{"bad flag", []string{"token", "-bogus"}, "flag provided but not defined"},
		{"up with bad ttl", []string{"up", "-dir", dir, "-ttl", "1s"}, "-ttl: at least 30s"},
		{"up with bad trust domain", []string{"up", "-dir", dir, "-trust-domain", "Not Valid"}, "-trust-domain"},
		{"kubelet without paths", []string{"kubelet"}, "-issuer-dir: required"},
		{"kubelet refreshing too late", []string{"kubelet", "-issuer-dir", dir, "-token-file", dir + "/t", "-ttl", "1m", "-refresh", "2m"}, "-refresh"},
		{"sds without target", []string{"sds", "-dir", dir}, "-socket or -pod is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := run(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %q (output %q)", err, tt.want, out)
			}
		})
	}
}

func TestTokenPrintsAJWT(t *testing.T) {
	out, err := run(t, "token", "-dir", t.TempDir(), "-ns", "default", "-sa", "web")
	if err != nil {
		t.Fatal(err)
	}
	if parts := strings.Split(strings.TrimSpace(out), "."); len(parts) != 3 {
		t.Fatalf("not a compact JWS: %q", out)
	}
}

func TestUsageListsEveryCommand(t *testing.T) {
	out, err := run(t, "help")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append(operator, compose.Commands...) {
		if !strings.Contains(out, "  "+c.Name+" ") {
			t.Errorf("usage does not list %s", c.Name)
		}
	}
	// The operator's commands come first; the compose plumbing is labelled apart.
	dev := strings.Index(out, "development stack")
	if dev < 0 || strings.Index(out, "  status ") > dev || strings.Index(out, "  kubelet ") < dev {
		t.Errorf("operator and development commands not grouped:\n%s", out)
	}
}

func TestHelpAnywhereGivesTheCommandsFlags(t *testing.T) {
	for _, args := range [][]string{{"rotate", "-h"}, {"rotate", "pod", "demo-0", "-h"}, {"kubelet", "--help"}} {
		_, err := run(t, args...)
		var b strings.Builder
		if !flagenv.PrintHelp(err, &b) || !strings.Contains(b.String(), "Usage of "+args[0]) {
			t.Errorf("%v: err %v, usage %q", args, err, b.String())
		}
	}
}

func TestReadersConnectAsAudit(t *testing.T) {
	tests := []struct {
		b    busFlags
		want policy.Role
		err  bool
	}{
		{busFlags{}, policy.Audit, false},
		{busFlags{nkey: "/x/audit.nk"}, policy.Audit, false},
		{busFlags{nkey: "/x/admin.nk"}, policy.Admin, false},
		{busFlags{creds: "/x/op.creds"}, policy.Admin, false},
		{busFlags{nkey: "/x/admin.nk", role: "audit"}, policy.Audit, false},
		{busFlags{role: "signer"}, "", true},
	}
	for _, tt := range tests {
		got, err := tt.b.readerRole()
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("%+v: %q, %v; want %q", tt.b, got, err, tt.want)
		}
	}
}
