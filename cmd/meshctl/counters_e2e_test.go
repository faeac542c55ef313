package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// historyCounts counts the last hour of the event history the way status prints
// its counts: "issued in the last hour: N (signer-0 N)" and "renewals sent in the
// last hour: N (reason N, ...)".
func historyCounts(t *testing.T, dir string) (issued, renewals string) {
	t.Helper()
	out, err := meshctlOut(t, "events", "-dir", dir, "-since", "1h", "-type", "cert.issued,rotation.renew_due", "-o", "json")
	if err != nil {
		t.Fatalf("events: %v", err)
	}
	bySigner, byReason := map[string]int{}, map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var e struct {
			Type string
			Data struct{ Signer, Reason string }
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		if e.Type == events.TypeRenewDue {
			byReason[e.Data.Reason]++
		} else {
			bySigner[e.Data.Signer]++
		}
	}
	line := func(m map[string]int) string {
		n, parts := 0, []string{}
		for k, v := range m {
			n += v
			parts = append(parts, fmt.Sprintf("%s %d", k, v))
		}
		sort.Strings(parts)
		if n == 0 {
			return "0"
		}
		return fmt.Sprintf("%d (%s)", n, strings.Join(parts, ", "))
	}
	return "issued in the last hour: " + line(bySigner), "renewals sent in the last hour: " + line(byReason)
}

// statusCounts is status's two count lines, trimmed ("" when absent).
func statusCounts(out string) (issued, renewals string) {
	issued = regexp.MustCompile(`issued in the last hour: [^\n]*`).FindString(out)
	renewals = strings.TrimSuffix(regexp.MustCompile(`renewals sent in the last hour: [^,\n]*(, [a-z-]+ \d+)*\)?`).FindString(out), ",")
	return strings.TrimSpace(issued), strings.TrimSpace(renewals)
}

// cutHistory cuts both event streams to their last message, with the signer's
// credential (the one role that may reconfigure them): what a status or an
// operator reads from the history afterwards is gone.
func cutHistory(t *testing.T, st *stackfile.Stack) {
	t.Helper()
	kp, err := policy.ReadSeed(filepath.Join(filepath.Dir(st.NATSAdminNKey), string(policy.Signer)+".nk"), nkeys.PrefixByteUser)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	nc, err := nats.Connect(st.NATSURL, nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(policy.Inbox(policy.Signer, events.PodRef{})), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 10*time.Second)
	for _, name := range []string{events.StreamEvents, events.StreamPodEvents} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		cfg.MaxMsgs = 1
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatalf("cut %s: %v", name, err)
		}
		if info, err := s.Info(ctx); err != nil || info.State.Msgs > 1 {
			t.Fatalf("%s holds %v message(s) after the cut: %v", name, info.State.Msgs, err)
		}
	}
}

// restartOperator stops the stack's operator service; meshctl up's supervisor
// starts it again. It returns once stack.json names a new pid and it is ready.
func restartOperator(t *testing.T, dir string) {
	t.Helper()
	pidOf := func() (int, string) {
		st, err := stackfile.Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st.Processes {
			if p.Name == "operator" {
				return p.PID, p.HTTP
			}
		}
		t.Fatal("stack.json lists no operator")
		return 0, ""
	}
	old, addr := pidOf()
	if err := syscall.Kill(old, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyWithin(t, time.Minute, "the operator restarted and ready", func() bool {
		pid, _ := pidOf()
		code, _ := testkit.HTTPGet("http://" + addr + "/readyz")
		return pid != old && code == 200
	})
}

// checkCountersOutliveHistory is TestOperatorView's step for issue 29's counters:
// status's last-hour counts equal what the history holds; with the history cut to
// its last message and the operator restarted, status and the page show the same.
func checkCountersOutliveHistory(t *testing.T, dir string, st *stackfile.Stack) {
	var issued, renewals string
	var out string
	testkit.EventuallyWithin(t, 30*time.Second, "status counts what the history holds", func() bool {
		issued, renewals = historyCounts(t, dir)
		out, _ = meshctl(t, "status", "-dir", dir)
		si, sr := statusCounts(out)
		return si == issued && sr == renewals
	})
	if !strings.Contains(renewals, events.RenewRootRotation) {
		t.Fatalf("no root-rotation renewal counted: %s\n%s", renewals, out)
	}
	var page struct {
		Counts struct {
			LastHour struct{ Issued, Renewals map[string]int } `json:"last_hour"`
		} `json:"counts"`
	}
	pageCounts := func() string {
		_, body := testkit.HTTPGet("http://" + st.Dashboard + "/api/inventory")
		if err := json.Unmarshal([]byte(body), &page); err != nil {
			return body
		}
		return fmt.Sprint(page.Counts.LastHour.Issued, page.Counts.LastHour.Renewals)
	}
	before := pageCounts()

	cutHistory(t, st)
	restartOperator(t, dir)
	out, _ = meshctl(t, "status", "-dir", dir)
	if si, sr := statusCounts(out); si != issued || sr != renewals {
		t.Fatalf("after the history was cut and the operator restarted, status counts %q, %q; want %q, %q\n%s", si, sr, issued, renewals, out)
	}
	if after := pageCounts(); after != before {
		t.Fatalf("the page's last-hour counts went from %s to %s", before, after)
	}
}
