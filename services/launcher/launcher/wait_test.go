package launcher_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/launcher/internal/waitready"
	"github.com/meshagent/meshagent/services/launcher/launcher"
	"github.com/meshagent/meshagent/tests/testkit"
)

// TestWaitBlocksUntilTheStatusPortIsReady: `launcher wait` (Istio's pilot-agent
// wait) against a real launcher's status port times out while sds-edge has no
// certificate, and returns once the pod is ready.
func TestWaitBlocksUntilTheStatusPortIsReady(t *testing.T) {
	p := newPod(t)
	s := p.start(p.args()...)
	testkit.Eventually(t, "status port bound", func() bool { return s.l.StatusAddr() != "" })
	url := "http://" + s.l.StatusAddr() + "/healthz/ready"
	ctx := context.Background()

	start := time.Now()
	var out bytes.Buffer
	err := launcher.Main(ctx, []string{"wait", "--url", url, "--timeoutSeconds", "1", "--periodMillis", "50"}, nil)
	if !errors.Is(err, waitready.ErrNotReady) || !strings.Contains(err.Error(), "503") {
		t.Fatalf("wait on a pod not ready: %v, want ErrNotReady naming the 503", err)
	}
	if d := time.Since(start); d < time.Second || d > 5*time.Second {
		t.Fatalf("a 1 s timeout took %s", d)
	}

	var mu sync.Mutex
	done := make(chan error, 1)
	go func() {
		c, err := waitready.Load([]string{"--url", url, "--timeoutSeconds", "60", "--periodMillis", "50"})
		if err != nil {
			done <- err
			return
		}
		mu.Lock()
		defer mu.Unlock()
		done <- waitready.Wait(ctx, c, clock.Real{}, &out)
	}()
	select {
	case err := <-done:
		t.Fatalf("wait returned before the pod was ready: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	p.relayReady.Store(true)
	p.giveSecrets()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("wait on a ready pod: %v", err)
		}
	case <-time.After(testkit.Timeout):
		t.Fatal("wait did not return once the pod was ready")
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(out.String(), "Envoy is ready!") {
		t.Fatalf("wait printed %q", out.String())
	}
}

func TestWaitFlagsAreIstios(t *testing.T) {
	c, err := waitready.Load(nil)
	if err != nil || c != (waitready.Config{TimeoutSeconds: 60, PeriodMillis: 500, URL: "http://localhost:15020/healthz/ready"}) {
		t.Fatalf("defaults %+v, %v", c, err)
	}
	_, err = waitready.Load([]string{"--timeoutSeconds", "0", "--periodMillis", "-1", "--url", "localhost:15020"})
	for _, w := range []string{"--timeoutSeconds", "--periodMillis", "--url"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("bad flags: %v, want %s named", err, w)
		}
	}
}
