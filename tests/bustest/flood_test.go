package bustest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// floodChild is set in the child process that hosts nats-server.
const floodChild = "MESHAGENT_FLOOD_SERVER_DIR"

// floodBound is how much one pod's flood may raise the RSS of the process that
// hosts nats-server (issue 37: 43 → 778 MiB in 60 s before).
const floodBound = 64 << 20

// TestFloodServerProcess is the child of TestOnePodsFloodIsBoundedInServerMemory:
// the embedded nats-server meshctl up runs (JetStream, the event streams), alone in
// its process so that its RSS is its own. It prints its URL and runs until its
// stdin closes.
func TestFloodServerProcess(t *testing.T) {
	dir := os.Getenv(floodChild)
	if dir == "" {
		t.Skip("the server process of TestOnePodsFloodIsBoundedInServerMemory")
	}
	s, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := bus.EnsureEventStream(ctx, JetStream(t, nc), 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	fmt.Printf("URL %s\n", s.ClientURL())
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
}

// TestOnePodsFloodIsBoundedInServerMemory: one pod floods its 14 event kinds with
// bodies over the readers' limit (68 KB, as the break-in did) and at the limit, as
// fast as the bus takes them, while a reader follows meshagent.evt.> live (meshctl
// up's view, the operator, audit). The RSS of the process hosting nats-server must
// not grow by more than 64 MiB: nats-server's own limits bound it (the stream's
// ingest queue, each client's pending bytes, the stream's message size, which is the
// readers' 65,536). MESHAGENT_FLOOD_SECONDS sets the flood's length (default 10).
func TestOnePodsFloodIsBoundedInServerMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("a flood of several seconds")
	}
	secs := 10
	if v, err := strconv.Atoi(os.Getenv("MESHAGENT_FLOOD_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFloodServerProcess$")
	cmd.Env = append(os.Environ(), floodChild+"="+t.TempDir())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	url := ""
	sc := bufio.NewScanner(out)
	for url == "" && sc.Scan() {
		if u, ok := strings.CutPrefix(sc.Text(), "URL "); ok {
			url = u
		}
	}
	go func() {
		for sc.Scan() { // drain
		}
	}()
	if url == "" {
		t.Fatal("the server process printed no URL")
	}
	pid := cmd.Process.Pid
	reader, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	var read atomic.Int64
	if _, err := reader.Subscribe("meshagent.evt.>", func(*nats.Msg) { read.Add(1) }); err != nil {
		t.Fatal(err)
	}
	pod, err := nats.Connect(url, nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	time.Sleep(500 * time.Millisecond) // the server settles after its start-up
	base, err := testkit.ProcStatusKB(pid, "VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	flooder := events.PodRef{Namespace: "attacker", Name: "demo-1"}
	bodies := [][]byte{make([]byte, 68_000), make([]byte, events.MaxEventSize)}
	sent, peak := 0, base
	end := time.Now().Add(time.Duration(secs) * time.Second)
	for time.Now().Before(end) {
		for i, kind := range events.PodEventKinds {
			subj, _ := events.PodEventSubject(flooder, kind)
			m := nats.NewMsg(subj)
			m.Header.Set(events.HeaderID, fmt.Sprint("flood-", sent))
			m.Data = bodies[i%2]
			if err := pod.PublishMsg(m); err != nil {
				if pod.IsClosed() {
					t.Fatalf("the flooding connection closed: %v", err)
				}
				continue // a slow-consumer refusal, a reconnect: flood on
			}
			sent++
		}
		if sent%1400 == 0 {
			if rss, err := testkit.ProcStatusKB(pid, "VmRSS"); err == nil && rss > peak {
				peak = rss
			}
		}
	}
	_ = pod.Flush()
	hwm, err := testkit.ProcStatusKB(pid, "VmHWM")
	if err == nil && hwm > peak {
		peak = hwm
	}
	grew := (peak - base) * 1024
	t.Logf("flood of %d events (%.0f MiB) in %d s: nats-server's process RSS %.0f -> peak %.0f MiB (+%.0f MiB, bound %d MiB); the live reader got %d",
		sent, float64(sent)*float64(66_768)/(1<<20), secs, base/1024, peak/1024, grew/(1<<20), floodBound>>20, read.Load())
	if grew > floodBound {
		t.Fatalf("one pod's flood raised nats-server's RSS by %.0f MiB, bound %d MiB", grew/(1<<20), floodBound>>20)
	}
}
