// Package supervisor runs the local stack's child processes (the service binaries
// of meshctl up): it starts each with its output in a log file, waits for its
// /readyz, reports the first one to exit, and stops them all in reverse order of
// start, SIGTERM first and SIGKILL after a grace period. Children run in their own
// process group, so that Ctrl-C reaches meshctl only, and die with meshctl if it is
// killed.
package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Supervisor holds the started children, in order of start.
type Supervisor struct {
	mu    sync.Mutex
	procs []*Process
}

// Process is one child: what to run, and its state once started.
type Process struct {
	Name    string   // for logs and errors, e.g. "demo-0/sds-edge"
	Bin     string   // path of the binary
	Args    []string // its arguments
	HTTP    string   // its health address (host:port): /readyz
	LogPath string   // where its stdout and stderr go

	cmd    *exec.Cmd
	exited chan struct{}
	err    error
}

// Start starts p, adds it to the children and waits up to readyWait for its
// /readyz to answer 200. A child started is stopped by Stop even if it never gets
// ready.
func (s *Supervisor) Start(ctx context.Context, p *Process, readyWait time.Duration) error {
	if err := p.start(); err != nil {
		return err
	}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return p.waitReady(ctx, readyWait)
}

// Processes returns the children, in order of start.
func (s *Supervisor) Processes() []*Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Process(nil), s.procs...)
}

// Stop stops the children in reverse order of start, each with grace to exit
// after SIGTERM before it is killed.
func (s *Supervisor) Stop(grace time.Duration) {
	procs := s.Processes()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop(grace)
	}
}

// Exited yields a message for each child that exits (its error and last log
// lines); the first one tells that the stack is broken.
func (s *Supervisor) Exited() <-chan string {
	procs := s.Processes()
	ch := make(chan string, len(procs))
	for _, p := range procs {
		go func() {
			<-p.exited
			ch <- p.Name + " exited: " + strconv.Quote(fmt.Sprint(p.err)) + "\n" + p.tail(10)
		}()
	}
	return ch
}

// PID is the child's process id (0 before it started).
func (p *Process) PID() int {
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *Process) start() error {
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("%s: log file: %w", p.Name, err)
	}
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group, so that Ctrl-C reaches meshctl only and meshctl stops the
	// children in order; and die with meshctl if it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	p.cmd = cmd
	p.exited = make(chan struct{})
	go func() {
		p.err = cmd.Wait()
		_ = logf.Close()
		close(p.exited)
	}()
	return nil
}

// stop sends SIGTERM and waits up to grace before killing.
func (p *Process) stop(grace time.Duration) {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// waitReady polls the child's /readyz until it answers 200, the child exits, or
// the limit passes.
func (p *Process) waitReady(ctx context.Context, limit time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(limit)
	for {
		resp, err := client.Get("http://" + p.HTTP + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited before it was ready (%v); last log lines:\n%s", p.Name, p.err, p.tail(15))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s; last log lines:\n%s", p.Name, limit, p.tail(15))
		}
	}
}

// tail returns the last n lines of the child's log.
func (p *Process) tail(n int) string {
	data, err := os.ReadFile(p.LogPath)
	if err != nil {
		return "(no log)"
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.ReplaceAll(string(bytes.Join(lines, []byte("\n"))), "\n", "\n  ")
}

// FreeAddr reserves a free loopback port and releases it for a child to bind.
func FreeAddr() (string, error) {
	addrs, err := FreeAddrs(1)
	if err != nil {
		return "", err
	}
	return addrs[0], nil
}

// FreeAddrs returns n distinct free loopback addresses (each held until all are
// found, then released for the children to bind).
func FreeAddrs(n int) ([]string, error) {
	addrs := make([]string, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, nil
}

// FindBinary looks for a service binary beside meshctl, then in bin/ under the
// working directory, then on PATH.
func FindBinary(dir, name string) (string, error) {
	var tried []string
	if dir != "" {
		tried = append(tried, filepath.Join(dir, name))
	}
	if exe, err := os.Executable(); err == nil {
		tried = append(tried, filepath.Join(filepath.Dir(exe), name))
	}
	tried = append(tried, filepath.Join("bin", name))
	for _, p := range tried {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return filepath.Abs(p)
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", errors.New("binary " + name + " not found (tried " + strings.Join(tried, ", ") + " and PATH): run make build")
}
