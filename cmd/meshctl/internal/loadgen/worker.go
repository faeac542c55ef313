package loadgen

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/meshagent/meshagent/pkg/devtoken"
)

// A storm larger than one process may hold (PodsPerWorker) runs its pods in
// worker processes: meshctl itself again (`bench storm-worker`, hidden), each
// given its job as one JSON line on stdin. A worker prepares its pods and
// says so ({"ready":true}), starts them when told ("go"), answers with its
// result, and holds its connections until its stdin closes — so that the
// parent measures while every connection is held.

// workerMsg is a worker's line on its stdout.
type workerMsg struct {
	Ready bool   `json:"ready,omitempty"`
	Pods  int    `json:"pods,omitempty"`
	Error string `json:"error,omitempty"`
	// The result, once the storm ran.
	Done          bool           `json:"done,omitempty"`
	Certified     int            `json:"certified,omitempty"`
	Failed        int            `json:"failed,omitempty"`
	Held          int64          `json:"held,omitempty"`
	Last          time.Time      `json:"last,omitzero"`
	Times         []int64        `json:"times,omitempty"`
	ConnTimes     []int64        `json:"conn_times,omitempty"`
	ConnectErrors map[string]int `json:"connect_errors,omitempty"`
}

// RunWorker is the `bench storm-worker` process: one job read from in, its
// pods run, its result written to out.
func RunWorker(ctx context.Context, in io.Reader, out io.Writer) error {
	r := bufio.NewReader(in)
	enc := json.NewEncoder(out)
	fail := func(err error) error {
		_ = enc.Encode(workerMsg{Error: err.Error()})
		return err
	}
	line, err := r.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("storm worker: read job: %w", err)
	}
	var j job
	if err := json.Unmarshal(line, &j); err != nil {
		return fail(fmt.Errorf("storm worker: job: %w", err))
	}
	iss, err := devtoken.Load(j.IssuerDir)
	if err != nil {
		return fail(err)
	}
	dir, err := os.MkdirTemp("", "meshctl-storm-worker-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	sim, err := preparePods(j, iss, dir)
	if err != nil {
		return fail(err)
	}
	if err := enc.Encode(workerMsg{Ready: true, Pods: len(sim)}); err != nil {
		return err
	}
	if _, err := r.ReadBytes('\n'); err != nil {
		return nil // the parent gave up before the start
	}
	run := runStorm(ctx, j, sim)
	defer closeAll(run.open)
	if err := enc.Encode(workerMsg{Done: true, Certified: run.certified, Failed: run.failed, Held: run.held, Last: run.last, Times: run.times, ConnTimes: run.connTimes,
		ConnectErrors: run.tally.snapshot()}); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, r) // every connection held until the parent has measured
	return nil
}

// worker is one worker process, seen from the storm.
type worker struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *json.Decoder
	log string
}

// startWorker starts argv with job j and waits for it to have prepared its pods.
func startWorker(ctx context.Context, argv []string, procs int, j job, log string) (*worker, error) {
	line, err := json.Marshal(j)
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stderr = logf
	cmd.SysProcAttr = childAttr()
	cmd.Env = procsEnv(procs)
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("storm worker: %w", err)
	}
	w := &worker{cmd: cmd, in: in, out: json.NewDecoder(out), log: log}
	if _, err := in.Write(append(line, '\n')); err != nil {
		return w, fmt.Errorf("storm worker %d: %w", j.Worker, err)
	}
	return w, nil
}

// next reads the worker's next line; a worker that failed or exited is an error.
func (w *worker) next() (workerMsg, error) {
	var m workerMsg
	if err := w.out.Decode(&m); err != nil {
		return m, fmt.Errorf("storm worker (pid %d) ended: %w\n%s", w.cmd.Process.Pid, err, tail(w.log))
	}
	if m.Error != "" {
		return m, fmt.Errorf("storm worker (pid %d): %s", w.cmd.Process.Pid, m.Error)
	}
	return m, nil
}

// stop closes the worker's stdin (it closes its connections and exits) and
// waits for it, killing it after 30 s.
func (w *worker) stop() {
	_ = w.in.Close()
	done := make(chan struct{})
	go func() {
		_ = w.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = w.cmd.Process.Kill()
		<-done
	}
}

// stormInWorkers runs the storm's pods in n worker processes: each prepares
// its share, then all start together, and the meter reads every process while
// each still holds its connections.
func stormInWorkers(ctx context.Context, cfg StormConfig, j job, n int, tier *nodeTier, work string) (StormResult, error) {
	argv := cfg.WorkerCommand
	if len(argv) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return StormResult{}, fmt.Errorf("storm workers: %w", err)
		}
		argv = []string{exe, "bench", "storm-worker"}
	}
	argv, err := niced(cfg.Nice, argv)
	if err != nil {
		return StormResult{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ws := make([]*worker, 0, n)
	defer func() {
		for _, w := range ws {
			w.stop()
		}
	}()
	for i := range n {
		jw := j
		jw.Worker, jw.Workers = i, n
		w, err := startWorker(ctx, argv, cfg.Procs, jw, filepath.Join(work, fmt.Sprintf("worker-%d.log", i)))
		if w != nil {
			ws = append(ws, w)
		}
		if err != nil {
			return StormResult{}, err
		}
	}
	if _, err := each(ws); err != nil { // every worker's pods prepared
		return StormResult{}, err
	}
	pids := make([]int, len(ws))
	for i, w := range ws {
		pids[i] = w.cmd.Process.Pid
	}
	m := startMeter(cfg, tier, pids)
	start := time.Now()
	for _, w := range ws {
		if _, err := io.WriteString(w.in, "go\n"); err != nil {
			return StormResult{}, fmt.Errorf("storm worker: %w", err)
		}
	}
	results, err := each(ws)
	if err != nil {
		return StormResult{}, err
	}
	run := stormRun{tally: &errTally{counts: map[string]int{}}}
	var last time.Time
	for _, r := range results {
		run.certified += r.Certified
		run.failed += r.Failed
		run.held += r.Held
		if r.Last.After(last) {
			last = r.Last
		}
		run.times = append(run.times, r.Times...)
		run.connTimes = append(run.connTimes, r.ConnTimes...)
		for e, k := range r.ConnectErrors {
			run.tally.counts[e] += k
		}
	}
	if !last.IsZero() {
		run.seconds = last.Sub(start).Seconds()
	}
	run.start = start
	res := cfg.result(run, n)
	m.finish(&res, run.held)
	return res, nil
}

// each reads one line from every worker at once.
func each(ws []*worker) ([]workerMsg, error) {
	msgs := make([]workerMsg, len(ws))
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() { msgs[i], errs[i] = w.next() })
	}
	wg.Wait()
	return msgs, errors.Join(errs...)
}
