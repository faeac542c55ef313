package supervisor

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/testkit"
)

// TestMain doubles as the child process: "child ADDR NAME STOPLOG" serves /readyz on
// ADDR and, on SIGTERM, appends NAME to STOPLOG and exits; "crash" exits 3 at once.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "child":
			child(os.Args[2], os.Args[3], os.Args[4])
			return
		case "crash":
			fmt.Println("child: cannot start")
			os.Exit(3)
		}
	}
	os.Exit(m.Run())
}

func child(addr, name, stopLog string) {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	http.HandleFunc("/readyz", func(http.ResponseWriter, *http.Request) {})
	go func() { _ = http.ListenAndServe(addr, nil) }()
	<-term
	f, err := os.OpenFile(stopLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		fmt.Fprintln(f, name)
		_ = f.Close()
	}
	os.Exit(0)
}

func newProcess(t *testing.T, dir, name string, args ...string) *Process {
	t.Helper()
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if len(args) == 0 {
		args = []string{"child", addr, name, filepath.Join(dir, "stopped")}
	}
	return &Process{Name: name, Bin: exe, Args: args, HTTP: addr, LogPath: filepath.Join(dir, name+".log")}
}

func TestStartWaitsForReadyAndStopGoesInReverse(t *testing.T) {
	dir := t.TempDir()
	var s Supervisor
	defer s.Stop(5 * time.Second)
	for _, name := range []string{"first", "second"} {
		if err := s.Start(context.Background(), newProcess(t, dir, name), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	ps := s.Processes()
	if len(ps) != 2 || ps[0].Name != "first" || ps[1].Name != "second" || ps[0].PID() == 0 {
		t.Fatalf("processes %+v", ps)
	}
	resp, err := http.Get("http://" + ps[1].HTTP + "/readyz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("second not ready after Start: %v", err)
	}
	_ = resp.Body.Close()
	s.Stop(5 * time.Second)
	data, err := os.ReadFile(filepath.Join(dir, "stopped"))
	if err != nil || string(data) != "second\nfirst\n" {
		t.Fatalf("stopped in order %q (%v), want second then first", data, err)
	}
}

func TestAChildThatDiesBeforeReadyIsReportedWithItsLog(t *testing.T) {
	dir := t.TempDir()
	var s Supervisor
	defer s.Stop(time.Second)
	err := s.Start(context.Background(), newProcess(t, dir, "broken", "crash"), time.Minute)
	if err == nil || !strings.Contains(err.Error(), "broken exited before it was ready") || !strings.Contains(err.Error(), "child: cannot start") {
		t.Fatalf("err = %v", err)
	}
}

func TestExitedNamesTheChildThatDied(t *testing.T) {
	dir := t.TempDir()
	var s Supervisor
	defer s.Stop(time.Second)
	p := newProcess(t, dir, "victim")
	if err := s.Start(context.Background(), p, time.Minute); err != nil {
		t.Fatal(err)
	}
	exited := s.Exited()
	if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if msg := <-exited; !strings.HasPrefix(msg, "victim exited: ") || !strings.Contains(msg, "killed") {
		t.Fatalf("exit message %q", msg)
	}
}

func TestFindBinaryNamesWhatItTried(t *testing.T) {
	_, err := FindBinary(t.TempDir(), "no-such-service-binary")
	if err == nil || !strings.Contains(err.Error(), "make build") {
		t.Fatalf("err = %v", err)
	}
}

func TestFreeAddrsAreDistinct(t *testing.T) {
	addrs, err := FreeAddrs(3)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 3 || addrs[0] == addrs[1] || addrs[1] == addrs[2] || addrs[0] == addrs[2] {
		t.Fatalf("addrs %v", addrs)
	}
	// Below the ephemeral range, where outgoing connections don't take them.
	low, high := freePortRange()
	for _, a := range addrs {
		_, p, _ := net.SplitHostPort(a)
		if port, _ := strconv.Atoi(p); port < low || port >= high {
			t.Errorf("%s: port outside [%d, %d)", a, low, high)
		}
	}
}

// TestRestartsACrashedChild: with Restart, a child killed after it was ready is
// reported, restarted (its log appended to, its restarts counted) and serves
// again; Stop then stops the new run, and nothing restarts after Stop.
func TestRestartsACrashedChild(t *testing.T) {
	dir := t.TempDir()
	restarted := make(chan int, 1)
	s := Supervisor{Restart: true, RestartBackoff: 10 * time.Millisecond, OnRestart: func(p *Process) { restarted <- p.PID() }}
	defer s.Stop(time.Second)
	p := newProcess(t, dir, "victim")
	if err := s.Start(context.Background(), p, time.Minute); err != nil {
		t.Fatal(err)
	}
	first := p.PID()
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-s.Exited():
		if !strings.HasPrefix(msg, "victim exited: ") || !strings.Contains(msg, "restarting it in 10ms (restart 1)") {
			t.Fatalf("exit message %q", msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit reported")
	}
	testkit.Eventually(t, "restarted", func() bool { return p.Restarts() == 1 })
	if err := p.waitReady(context.Background(), time.Minute); err != nil {
		t.Fatal(err)
	}
	if p.PID() == first || p.Restarts() != 1 {
		t.Fatalf("pid %d (was %d), %d restarts: want a new run, 1 restart", p.PID(), first, p.Restarts())
	}
	// OnRestart was told the new run's pid (meshctl up rewrites stack.json with it).
	select {
	case pid := <-restarted:
		if pid != p.PID() {
			t.Fatalf("OnRestart saw pid %d, the new run is %d", pid, p.PID())
		}
	default:
		t.Fatal("OnRestart not called")
	}
	if log, _ := os.ReadFile(p.LogPath); !strings.Contains(string(log), "restarting victim (restart 1)") {
		t.Fatalf("log %q lacks the restart line", log)
	}
	s.Stop(5 * time.Second)
	if data, err := os.ReadFile(filepath.Join(dir, "stopped")); err != nil || string(data) != "victim\n" {
		t.Fatalf("stop log %q (%v): the restarted run was not stopped", data, err)
	}
	if p.Restarts() != 1 {
		t.Fatal("restarted after Stop")
	}
}
