package main

import (
	"bufio"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/tests/testkit"
)

// A pod run as one process (meshagent pod) is admitted to the bus once: its three
// roles share one connection, where the three-process pod is admitted three
// times. Counted by the signer's auth callout, the only way a pod gets on the bus.
func TestOneProcessPodIsAdmittedOnce(t *testing.T) {
	if _, err := os.Stat(filepath.Join(binDir, "meshagent")); err != nil {
		t.Skip("no meshagent executable in the binaries (make build; MESHAGENT_BIN)")
	}
	for _, tc := range []struct {
		name string
		one  bool
		want float64
	}{{"one process", true, 1}, {"three processes", false, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testkit.ShortDir(t)
			startStack(t, devstack.Config{Dir: dir, Pods: 1, LeafTTL: time.Hour, OneProcessPods: tc.one})
			st, err := stackfile.Read(dir)
			if err != nil {
				t.Fatal(err)
			}
			var got float64
			// Every role is ready (startStack waited): each has connected.
			testkit.EventuallyWithin(t, 10*time.Second, "admissions counted", func() bool {
				got = admitted(t, "http://"+st.Signer.HTTP+"/metrics")
				return got >= tc.want
			})
			if got != tc.want {
				t.Fatalf("the pod was admitted %v times, want %v", got, tc.want)
			}
		})
	}
}

func admitted(t *testing.T, url string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "meshagent_signer_bus_callout_admitted_total "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}
