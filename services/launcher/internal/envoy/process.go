package envoy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Options are the knobs of Envoy's command line, as Istio's agent sets them.
type Options struct {
	ConfigPath        string
	DrainDuration     time.Duration // --drain-time-s
	ParentShutdown    time.Duration // --parent-shutdown-time-s
	IPv6              bool          // --local-address-ip-version v6 (the pod's IP is v6)
	LogLevel          string        // -l
	ComponentLevel    string        // --component-log-level
	LogJSON           bool          // --log-format as JSON
	Concurrency       int           // --concurrency; 0: Envoy's default (one per CPU)
	Extra             []string
	FileFlushMillis   int // --file-flush-interval-msec
	DisableHotRestart bool
}

// Text and JSON log formats, as Istio's agent passes them.
const (
	logFormatText = "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t"
	logFormatJSON = `{"level":"%l","time":"%Y-%m-%dT%T.%fZ","scope":"envoy %n","msg":"%j","caller":"%g:%#","thread":%t}`
)

// Args returns Envoy's arguments, in the order Istio's agent writes them.
func Args(o Options) []string {
	ipv := "v4"
	if o.IPv6 {
		ipv = "v6"
	}
	format := logFormatText
	if o.LogJSON {
		format = logFormatJSON
	}
	flush := o.FileFlushMillis
	if flush == 0 {
		flush = 1000
	}
	args := []string{
		"-c", o.ConfigPath,
		"--drain-time-s", strconv.Itoa(int(o.DrainDuration / time.Second)),
		"--drain-strategy", "immediate",
		"--parent-shutdown-time-s", strconv.Itoa(int(o.ParentShutdown / time.Second)),
		"--local-address-ip-version", ipv,
		"--file-flush-interval-msec", strconv.Itoa(flush),
		"--disable-hot-restart",
		"--allow-unknown-static-fields",
		"--log-format", format,
	}
	if o.LogLevel != "" {
		args = append(args, "-l", o.LogLevel)
	}
	if o.ComponentLevel != "" {
		args = append(args, "--component-log-level", o.ComponentLevel)
	}
	if o.Concurrency > 0 {
		args = append(args, "--concurrency", strconv.Itoa(o.Concurrency))
	}
	return append(args, o.Extra...)
}

// Version runs `binary --version` and returns its first non-empty line ("" if it
// says nothing within a few seconds).
func Version(ctx context.Context, binary string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, binary, "--version").Output()
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			return l
		}
	}
	return ""
}

// Exit is how Envoy's process ended.
type Exit struct {
	Code   int    // -1 when a signal ended it
	Signal string // the signal's name, "" when it exited by itself
	Err    error  // waiting failed (not an exit status)
}

func (e Exit) String() string {
	switch {
	case e.Err != nil:
		return "wait failed: " + e.Err.Error()
	case e.Signal != "":
		return "killed by signal " + e.Signal
	default:
		return "exit code " + strconv.Itoa(e.Code)
	}
}

// Process is one started Envoy.
type Process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	exit   Exit
}

// Spec says how to start Envoy.
type Spec struct {
	Binary         string
	Args           []string
	Env            []string // nil: the launcher's environment
	Stdout, Stderr io.Writer
	UID, GID       int // -1: the launcher's
}

// Start starts Envoy. Its stdout and stderr go to spec's writers (the launcher's own
// when nil). It is never killed by the launcher's context: Stop and Kill do that.
func Start(spec Spec) (*Process, error) {
	cmd := exec.Command(spec.Binary, spec.Args...)
	cmd.Env = spec.Env
	cmd.Stdout, cmd.Stderr = spec.Stdout, spec.Stderr
	if cmd.Stdout == nil {
		cmd.Stdout = os.Stdout
	}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	if err := setCredential(cmd, spec.UID, spec.GID); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start envoy: %w", err)
	}
	p := &Process{cmd: cmd, exited: make(chan struct{})}
	go p.wait()
	return p, nil
}

func (p *Process) wait() {
	err := p.cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		p.exit = Exit{Code: 0}
	case errors.As(err, &ee):
		p.exit = Exit{Code: ee.ExitCode()}
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.exit = Exit{Code: -1, Signal: ws.Signal().String()}
		}
	default:
		p.exit = Exit{Code: -1, Err: err}
	}
	close(p.exited)
}

// PID is Envoy's process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited is closed once Envoy's process has ended.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Exit is how Envoy ended; only valid once Exited is closed.
func (p *Process) Exit() Exit { <-p.exited; return p.exit }

// Signal sends sig to Envoy; after it has exited, it does nothing.
func (p *Process) Signal(sig os.Signal) {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(sig)
	}
}
