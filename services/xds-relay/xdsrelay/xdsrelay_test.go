package xdsrelay_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/services/xds-relay/xdsrelay"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// New binds nothing and dials nothing; Run binds the ADS socket (serving Envoy
// even with no sds-edge and no upstream yet, as Istio's agent, but not ready
// until the upstream is reached) and returns nil when cancelled, having closed
// its sds-edge and upstream connections (TestMain checks for leaks).
func TestNewBuildsOnlyAndRunServesUntilCancelled(t *testing.T) {
	ns := bustest.Server(t)
	root := testkit.ShortDir(t)
	addr := testkit.FreeAddr(t)
	_, tapPort, _ := net.SplitHostPort(testkit.FreeAddr(t))
	cfg, err := xdsrelay.Load([]string{"-pod", "web-0", "-pod-root", root, "-discovery-address", addr,
		"-xds-tls", "mtls", "-debug-tap-port", tapPort}, testkit.Env(nil))
	if err != nil {
		t.Fatal(err)
	}
	health := obs.NewServer("", hclog.NewNullLogger())
	x, err := xdsrelay.New(cfg, lifecycle.Deps{Bus: bustest.Conn(t, ns), Health: health}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/istio/proxy/XDS")); !os.IsNotExist(err) {
		t.Fatalf("socket after New: %v, want none yet", err)
	}
	if health.Ready() == nil {
		t.Fatal("ready before Run")
	}
	stop := testkit.Background(t, x.Run)
	testkit.Eventually(t, "the ADS socket bound, the upstream not reachable", func() bool {
		err := health.Ready()
		return err != nil && !strings.Contains(err.Error(), "xds-socket") && !strings.Contains(err.Error(), "debug-tap") && strings.Contains(err.Error(), "upstream: "+addr+" not reachable")
	})
	if _, err := os.Stat(filepath.Join(root, "etc/istio/proxy/XDS")); err != nil {
		t.Fatalf("socket: %v", err)
	}
	stop()
	if _, err := os.Stat(filepath.Join(root, "etc/istio/proxy/XDS")); !os.IsNotExist(err) {
		t.Fatalf("socket after Run returned: %v, want it removed", err)
	}
}

func TestNewWithoutBusIsAnError(t *testing.T) {
	cfg, err := xdsrelay.Load([]string{"-pod", "web-0", "-xds-tls", "plaintext"}, testkit.Env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := xdsrelay.New(cfg, lifecycle.Deps{}.WithDefaults()); err == nil {
		t.Fatal("built a relay with no bus")
	}
}
