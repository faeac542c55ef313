package compose

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
)

func run(ctx context.Context, t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	env := command.Env{Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}
	for _, c := range Commands {
		if c.Name == name {
			err := c.Run(ctx, env, args)
			return out.String(), err
		}
	}
	t.Fatalf("no command %s", name)
	return "", nil
}

func TestKubeletWritesIssuerAndToken(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // write once, then stop
	tokenFile := dir + "/pod/var/run/secrets/tokens/istio-token"
	out, err := run(ctx, t, "kubelet", "-issuer-dir", dir+"/issuer", "-token-file", tokenFile, "-ns", "default", "-sa", "demo")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "token for default/demo written to "+tokenFile) {
		t.Fatalf("output %q", out)
	}
	tok, err := os.ReadFile(tokenFile)
	if err != nil || strings.Count(string(tok), ".") != 2 {
		t.Fatalf("token %q: %v", tok, err)
	}
	if _, err := os.Stat(dir + "/issuer/jwks.json"); err != nil {
		t.Fatal(err)
	}
}

func TestComposeSecretsSplitsTheServerList(t *testing.T) {
	dir := t.TempDir()
	out, err := run(context.Background(), t, "compose-secrets", "-state", filepath.Join(dir, "state"), "-out", filepath.Join(dir, "out"), "-servers", " a, b ,")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(strings.TrimSpace(out), "a, b") {
		t.Fatalf("output %q", out)
	}
	for _, s := range []string{"a", "b"} {
		if _, err := os.Stat(filepath.Join(dir, "out", s, "nats-auth.conf")); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBadInvocationsNameTheFlag(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"kubelet", nil, "-issuer-dir: required"},
		{"kubelet", []string{"-issuer-dir", dir, "-token-file", dir + "/t", "-ttl", "1m", "-refresh", "2m"}, "-refresh"},
		{"compose-secrets", []string{"-out", dir}, "-state: required"},
		{"controlplane", []string{"-log-level", "loud"}, "-log-level"},
	}
	for _, tt := range tests {
		t.Run(tt.name+" "+strings.Join(tt.args, " "), func(t *testing.T) {
			if _, err := run(context.Background(), t, tt.name, tt.args...); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.want)
			}
		})
	}
}
