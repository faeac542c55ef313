package policy_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/events"
)

func contextTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// ref is a pod as a test writes it: "<namespace>/<name>", a bare name in the
// default namespace.
func ref(s string) events.PodRef {
	p, err := events.ParsePodRef(s)
	if err != nil {
		panic(err)
	}
	return p
}

func nullLogger() hclog.Logger { return hclog.NewNullLogger() }
