// Package supervisor runs the local stack's child processes (the service binaries
// of meshctl up): it starts each with its output in a log file, waits for its
// /readyz, reports each exit and, with Restart, restarts the child with backoff as
// a pod's restartPolicy Always would, and stops them all in reverse order of start,
// SIGTERM first and SIGKILL after a grace period. Children run in their own
// process group, so that Ctrl-C reaches meshctl only, and die with meshctl if it is
// killed.
package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

	"github.com/meshagent/meshagent/pkg/backoff"
)

// Supervisor holds the started children, in order of start.
type Supervisor struct {
	// Restart restarts a child that exits after it was ready, after a backoff
	// (RestartBackoff doubling to MaxRestartBackoff, back to the start once a run
	// lasted RestartReset), with its log appended to; Exited reports each exit.
	// Without it a child that exits stays down, and Exited reports that.
	Restart bool
	// RestartBackoff is the first wait before a restart; DefaultRestartBackoff when zero.
	RestartBackoff time.Duration
	// OnRestart, when set, is called after each restart with the child's new run
	// (its new PID), from the goroutine that restarted it.
	OnRestart func(*Process)

	mu       sync.Mutex
	procs    []*Process
	stopping bool
	exits    chan string
	done     chan struct{} // closed by Stop: ends restart waits
}

// Restart backoff bounds.
const (
	DefaultRestartBackoff = time.Second
	MaxRestartBackoff     = 30 * time.Second
	// RestartReset: a run this long starts the backoff over.
	RestartReset = time.Minute
)

// Process is one child: what to run, and its state once started.
type Process struct {
	Name    string   // for logs and errors, e.g. "demo-0/sds-edge"
	Bin     string   // path of the binary
	Args    []string // its arguments
	HTTP    string   // its health address (host:port): /readyz
	LogPath string   // where its stdout and stderr go
	Env     []string // added to meshctl's environment ("KEY=value")

	mu       sync.Mutex // guards cmd, exited and err, which each (re)start replaces
	cmd      *exec.Cmd
	exited   chan struct{}
	err      error
	restarts int
	started  time.Time
}

// Start starts p, adds it to the children and waits up to readyWait for its
// /readyz to answer 200. A child started is stopped by Stop even if it never gets
// ready. From then on its exits are reported on Exited (and, with Restart, it is
// restarted).
func (s *Supervisor) Start(ctx context.Context, p *Process, readyWait time.Duration) error {
	if err := s.Launch(p); err != nil {
		return err
	}
	return s.Ready(ctx, p, readyWait)
}

// Launch starts p and adds it to the children without waiting for it: the caller
// waits by its own means (the events the child publishes, watching Done), then
// calls Ready. Many children launched together start in parallel.
func (s *Supervisor) Launch(p *Process) error {
	if err := p.start(false); err != nil {
		return err
	}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return nil
}

// Ready waits up to readyWait for a launched p's /readyz to answer 200 (one request
// when it already does); from then on p's exits are reported on Exited (and, with
// Restart, it is restarted).
func (s *Supervisor) Ready(ctx context.Context, p *Process, readyWait time.Duration) error {
	if err := p.waitReady(ctx, readyWait); err != nil {
		return err
	}
	go s.watch(p)
	return nil
}

// Processes returns the children, in order of start.
func (s *Supervisor) Processes() []*Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Process(nil), s.procs...)
}

// Stop stops the children in reverse order of start, each with grace to exit
// after SIGTERM before it is killed. Nothing is restarted once Stop is called.
func (s *Supervisor) Stop(grace time.Duration) {
	s.chans()
	s.mu.Lock()
	if !s.stopping {
		s.stopping = true
		close(s.done)
	}
	s.mu.Unlock()
	procs := s.Processes()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop(grace)
	}
}

// Exited yields a message for each exit of a child once it was ready (its error,
// whether and when it is restarted, and its last log lines). Without Restart the
// first one tells that the stack is broken.
func (s *Supervisor) Exited() <-chan string { return s.chans().exits }

// chans makes the supervisor's channels on first use (its zero value is ready).
func (s *Supervisor) chans() *Supervisor {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exits == nil {
		s.exits, s.done = make(chan string, 64), make(chan struct{})
	}
	return s
}

// report queues msg on Exited, dropping it if nobody reads and the queue is full.
func (s *Supervisor) report(msg string) {
	ch := s.chans().exits
	select {
	case ch <- msg:
	default:
	}
}

// watch reports each exit of p and, with Restart, restarts it, until Stop.
func (s *Supervisor) watch(p *Process) {
	first := s.RestartBackoff
	if first <= 0 {
		first = DefaultRestartBackoff
	}
	// No jitter: one developer's stack, and the report says the wait it will take.
	bo := backoff.Policy{First: first, Max: MaxRestartBackoff}.Start()
	for {
		started, exited := p.state()
		<-exited
		s.mu.Lock()
		stopping := s.stopping
		s.mu.Unlock()
		if stopping {
			return
		}
		p.mu.Lock()
		err := p.err
		p.mu.Unlock()
		msg := p.Name + " exited: " + strconv.Quote(fmt.Sprint(err))
		if !s.Restart {
			s.report(msg + "\n" + p.tail(10))
			return
		}
		if time.Since(started) >= RestartReset {
			bo.Reset()
		}
		wait := bo.Next()
		s.report(fmt.Sprintf("%s; restarting it in %s (restart %d)\n%s", msg, wait, p.Restarts()+1, p.tail(10)))
		select {
		case <-s.chans().done:
			return
		case <-time.After(wait):
		}
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			return
		}
		err = p.start(true)
		s.mu.Unlock()
		if err != nil {
			s.report(fmt.Sprintf("%s: restart failed: %v", p.Name, err))
			return
		}
		if s.OnRestart != nil {
			s.OnRestart(p)
		}
	}
}

// Restarts is how many times the child was restarted.
func (p *Process) Restarts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts
}

// state is when the current run started and the channel closed when it ends.
func (p *Process) state() (time.Time, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started, p.exited
}

// Done is closed when the child's current run ends (nil before it started).
func (p *Process) Done() <-chan struct{} {
	_, exited := p.state()
	return exited
}

// ExitError says that the child exited before it was ready, with its error and its
// last log lines.
func (p *Process) ExitError() error {
	p.mu.Lock()
	err := p.err
	p.mu.Unlock()
	return fmt.Errorf("%s exited before it was ready (%v); last log lines:\n%s", p.Name, err, p.tail(15))
}

// PID is the child's current process id (0 before it started).
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// start starts the child: its log file truncated, or, for a restart, appended to.
func (p *Process) start(restart bool) error {
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if restart {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	logf, err := os.OpenFile(p.LogPath, flags, 0o644)
	if err != nil {
		return fmt.Errorf("%s: log file: %w", p.Name, err)
	}
	if restart {
		fmt.Fprintf(logf, "--- meshctl: restarting %s (restart %d) ---\n", p.Name, p.Restarts()+1)
	}
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if len(p.Env) > 0 {
		cmd.Env = append(os.Environ(), p.Env...)
	}
	// Own process group, so that Ctrl-C reaches meshctl only and meshctl stops the
	// children in order; and die with meshctl if it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited, p.err, p.started = cmd, exited, nil, time.Now()
	if restart {
		p.restarts++
	}
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(exited)
	}()
	return nil
}

// stop sends SIGTERM to the current run and waits up to grace before killing.
func (p *Process) stop(grace time.Duration) {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// waitReady polls the child's /readyz until it answers 200, the child exits, or
// the limit passes.
func (p *Process) waitReady(ctx context.Context, limit time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(limit)
	// A service is usually ready within tens of milliseconds: ask soon, then
	// every 100 ms at most.
	wait := backoff.Policy{First: 5 * time.Millisecond, Max: 100 * time.Millisecond}.Start()
	for {
		resp, err := client.Get("http://" + p.HTTP + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		_, exited := p.state()
		select {
		case <-exited:
			return p.ExitError()
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait.Next()):
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
//
// They are picked below the kernel's ephemeral range (ip_local_port_range) where
// there is room: a port the kernel chose for bind(":0") is, once released, handed
// out again as the source port of outgoing connections — fifty pods starting make
// hundreds of them (NATS, readiness checks) — and the child that comes to bind it
// a moment later could find it taken. (tests/testkit.FreeAddr picks test servers'
// ports the same way; the two stay apart because testkit is for tests only.)
func FreeAddrs(n int) ([]string, error) {
	addrs := make([]string, 0, n)
	low, high := freePortRange()
	for range n {
		ln, err := listenBelowEphemeral(low, high)
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, nil
}

// listenBelowEphemeral listens on a random free loopback port in [low, high), or
// on one the kernel picks when fifty tries found none.
func listenBelowEphemeral(low, high int) (net.Listener, error) {
	for range 50 {
		port := low + rand.IntN(high-low)
		if ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
			return ln, nil
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// freePortRange is where FreeAddrs picks from: [10000, the ephemeral range's low
// end), or [10000, 32768) when the range cannot be read or leaves no room.
func freePortRange() (low, high int) {
	low, high = 10000, 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return low, high
	}
	if f := strings.Fields(string(b)); len(f) == 2 {
		if n, err := strconv.Atoi(f[0]); err == nil && n > low+1000 {
			high = n
		}
	}
	return low, high
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
