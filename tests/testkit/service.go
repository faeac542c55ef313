package testkit

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ReadyTimeout is how long StartService waits for a service's /readyz.
const ReadyTimeout = 30 * time.Second

// Binary returns the path of a meshagent program (a service under services/,
// meshctl, meshagent or envoy-standin): $MESHAGENT_BIN/<name> when MESHAGENT_BIN
// is set (make bench builds it), else the program built for this test, as make
// build does, into a directory removed when the test ends.
func Binary(t testing.TB, name string) string {
	t.Helper()
	if dir := os.Getenv("MESHAGENT_BIN"); dir != "" {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("MESHAGENT_BIN: %v", err)
		}
		return path
	}
	dir := t.TempDir()
	if err := build(dir, name, packagePath(name)); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, name)
}

// packagePath is the import path of the program name.
func packagePath(name string) string {
	const mod = "github.com/meshagent/meshagent/"
	switch name {
	case "meshctl", "meshagent":
		return mod + "cmd/" + name
	case "envoy-standin":
		return mod + "services/launcher/cmd/envoy-standin"
	}
	return mod + "services/" + name
}

// Service is a service binary started by StartService.
type Service struct {
	Name     string
	Cmd      *exec.Cmd
	HTTPAddr string  // its health and metrics address (-http-addr)
	Logs     *Buffer // its stdout and stderr
}

// StartService runs the service binary name (see Binary) with args and
// -http-addr on a free loopback port, its environment the test's plus env
// ("KEY=value"); waits until its /readyz answers 200 (failing t with the
// service's output after ReadyTimeout, or at once if it exits); and stops it
// when the test ends: SIGTERM, then SIGKILL after Timeout.
func StartService(t testing.TB, name string, args []string, env ...string) *Service {
	t.Helper()
	s := &Service{Name: name, HTTPAddr: FreeAddr(t), Logs: &Buffer{}}
	s.Cmd = exec.Command(Binary(t, name), append(args, "-http-addr", s.HTTPAddr)...)
	s.Cmd.Env = append(os.Environ(), env...)
	s.Cmd.Stdout, s.Cmd.Stderr = s.Logs, s.Logs
	if err := s.Cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = s.Cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = s.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(Timeout):
			_ = s.Cmd.Process.Kill()
			<-exited
		}
	})
	var gone bool
	ready := Poll(ReadyTimeout, func() bool {
		select {
		case <-exited:
			gone = true
			return true
		default:
		}
		code, _ := HTTPGet("http://" + s.HTTPAddr + "/readyz")
		return code == http.StatusOK
	})
	switch {
	case gone:
		t.Fatalf("%s exited before it was ready (%v):\n%s", name, s.Cmd.ProcessState, s.Logs.String())
	case !ready:
		t.Fatalf("%s not ready after %s:\n%s", name, ReadyTimeout, s.Logs.String())
	}
	return s
}

// Pid is the service's process id.
func (s *Service) Pid() int { return s.Cmd.Process.Pid }

// CPU is the CPU time (user and system) the service has used so far.
func (s *Service) CPU(t testing.TB) time.Duration {
	t.Helper()
	d, err := ProcCPU(s.Pid())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// ProcCPU is the CPU time (user and system) process pid has used, from
// /proc/<pid>/stat (in clock ticks of 10 ms).
func ProcCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the ")" that ends the command name; utime and stime are
	// the 12th and 13th of them (14 and 15 of the line).
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, data)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, data)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// ProcStatusKB reads a kB field of /proc/<pid>/status ("VmRSS", "RssAnon", ...).
func ProcStatusKB(pid int, field string) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// Launch starts cmd with its output (stdout and stderr) into logs, and stops it
// when t ends — SIGTERM, then waits for it — logging that output under what if t
// failed. For a process a test drives itself (a pod's agent with its own
// environment), where StartService's readiness wait does not fit.
func Launch(t testing.TB, cmd *exec.Cmd, logs *Buffer, what string) {
	t.Helper()
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", what, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s:\n%s", what, logs.String())
		}
	})
}
