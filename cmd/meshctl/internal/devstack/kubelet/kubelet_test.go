package kubelet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/devtoken"
)

func TestWriteAllWritesEachPodsTokenOwnerOnly(t *testing.T) {
	dir := t.TempDir()
	iss, err := devtoken.Generate()
	if err != nil {
		t.Fatal(err)
	}
	var reported []string
	k := &Kubelet{Issuer: iss, TTL: time.Hour, Tokens: []Token{
		{File: filepath.Join(dir, "demo-0/var/run/secrets/tokens/istio-token"), Namespace: "default", ServiceAccount: "demo", Pod: "demo-0"},
		{File: filepath.Join(dir, "demo-1/var/run/secrets/tokens/istio-token"), Namespace: "default", ServiceAccount: "demo", Pod: "demo-1"},
	}, Report: func(tok Token, err error) {
		if err != nil {
			t.Errorf("%s: %v", tok.File, err)
		}
		reported = append(reported, tok.Pod)
	}}
	if err := k.WriteAll(time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, tok := range k.Tokens {
		data, err := os.ReadFile(tok.File)
		if err != nil || strings.Count(string(data), ".") != 2 {
			t.Fatalf("%s: %q, %v", tok.File, data, err)
		}
		if fi, _ := os.Stat(tok.File); fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v", tok.File, fi.Mode().Perm())
		}
	}
	if strings.Join(reported, ",") != "demo-0,demo-1" {
		t.Fatalf("reported %v", reported)
	}
}

func TestWriteAllReportsAFileItCannotWrite(t *testing.T) {
	iss, err := devtoken.Generate()
	if err != nil {
		t.Fatal(err)
	}
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	k := &Kubelet{Issuer: iss, TTL: time.Hour, Tokens: []Token{{File: filepath.Join(blocker, "token"), Namespace: "a", ServiceAccount: "b"}}}
	if err := k.WriteAll(time.Now()); err == nil {
		t.Fatal("a token under a regular file was written")
	}
}
