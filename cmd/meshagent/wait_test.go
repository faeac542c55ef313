package main

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestWaitExitCodes runs `meshagent wait` and `meshagent launcher wait` as a
// process (this test binary re-executed into main) and checks Istio's exit
// codes: 0 ready, 1 not ready in time or a bad flag.
func TestWaitExitCodes(t *testing.T) {
	if args := os.Getenv("MESHAGENT_TEST_MAIN"); args != "" {
		os.Args = append([]string{"meshagent"}, strings.Fields(args)...)
		main()
		return
	}
	ready := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer ready.Close()
	notReady := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
	}))
	defer notReady.Close()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args string
		code int
	}{
		{"wait --url " + ready.URL + "/healthz/ready", 0},
		{"launcher wait --url " + ready.URL + "/healthz/ready --periodMillis 100", 0},
		{"wait --url " + notReady.URL + "/healthz/ready --timeoutSeconds 1 --periodMillis 100", 1},
		{"launcher wait --timeoutSeconds 0", 1},
	} {
		cmd := exec.Command(exe, "-test.run=^TestWaitExitCodes$")
		cmd.Env = append(os.Environ(), "MESHAGENT_TEST_MAIN="+tc.args)
		out, err := cmd.CombinedOutput()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code {
			t.Errorf("meshagent %s: exit %d, want %d\n%s", tc.args, code, tc.code, out)
		}
	}
}
