package loadgen

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
)

// cpuReader reads a signer's cumulative CPU seconds.
type cpuReader struct {
	pid     int
	metrics string
}

// signerCPU picks how to read the signer's CPU: /proc for a local pid (given, or the
// local stack's signer process), else its /metrics.
func signerCPU(pid int, metricsURL string, st *stackfile.Stack) cpuReader {
	if pid == 0 && metricsURL == "" && st != nil {
		for _, p := range st.Processes {
			if p.Name == "signer" {
				pid = p.PID
			}
		}
		metricsURL = signerMetrics(st)
	}
	if pid != 0 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/stat", pid)); err != nil {
			pid = 0 // not this machine's
		}
	}
	return cpuReader{pid: pid, metrics: metricsURL}
}

// signerMetrics is the local stack's signer's /metrics URL, or "".
func signerMetrics(st *stackfile.Stack) string {
	if st.Signer.HTTP == "" {
		return ""
	}
	return "http://" + st.Signer.HTTP + "/metrics"
}

func (c cpuReader) source() string {
	if c.pid != 0 {
		return fmt.Sprintf("/proc/%d/stat", c.pid)
	}
	return c.metrics
}

func (c cpuReader) read() (float64, error) {
	switch {
	case c.pid != 0:
		return procCPUSeconds(c.pid)
	case c.metrics != "":
		return metricsCPUSeconds(c.metrics)
	}
	return 0, errors.New("no way to read the signer's CPU")
}

// procCPUSeconds is a process's user+system CPU time from /proc/<pid>/stat.
func procCPUSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the ")" closing the command name; utime and stime are the
	// 14th and 15th of the line, in clock ticks (USER_HZ, 100 on Linux).
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return (ut + st) / 100, nil
}

// metricsCPUSeconds reads process_cpu_seconds_total from a Prometheus text page.
func metricsCPUSeconds(url string) (float64, error) {
	body, err := get(url)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	return parseCPUSeconds(body)
}

// get is a page's body (5 s to answer, 200 OK only).
func get(url string) (io.ReadCloser, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return cancelOnClose{resp.Body, cancel}, nil
}

// cancelOnClose is a response body that ends its request's context when closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	defer c.cancel()
	return c.ReadCloser.Close()
}

func parseCPUSeconds(r io.Reader) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_cpu_seconds_total "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("no process_cpu_seconds_total in the metrics")
}

// metricPage is a Prometheus text page's samples by series.
type metricPage map[string]float64

func (m metricPage) sum(prefix string) float64 {
	var s float64
	for k, v := range m {
		if k == prefix || !strings.Contains(prefix, "{") && strings.HasPrefix(k, prefix+"{") {
			s += v
		}
	}
	return s
}

// delta is series' growth from before to m.
func (m metricPage) delta(before metricPage, series string) float64 {
	return m.sum(series) - before.sum(series)
}

func scrape(u string) (metricPage, error) {
	if u == "" {
		return nil, errors.New("no metrics URL")
	}
	body, err := get(u)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	page := metricPage{}
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			page[line[:i]] = v
		}
	}
	return page, sc.Err()
}

// procRSS is a process's resident memory in bytes (/proc/<pid>/status VmRSS).
func procRSS(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS")
}

// listenerPID finds the local process listening on natsURL's port (the stack's
// `meshctl up`, which embeds nats-server), or 0.
func listenerPID(natsURL string) int {
	u, err := url.Parse(natsURL)
	if err != nil {
		return 0
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return 0
	}
	inodes := listeningInodes(port)
	procs, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range procs {
		if target, err := os.Readlink(fd); err == nil && inodes[target] {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			return pid
		}
	}
	return 0
}

// listeningInodes are the sockets listening on port, as /proc/<pid>/fd names
// them ("socket:[inode]").
func listeningInodes(port int) map[string]bool {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			fl := strings.Fields(line)
			if len(fl) < 10 || fl[3] != "0A" { // LISTEN
				continue
			}
			i := strings.LastIndexByte(fl[1], ':')
			if p, err := strconv.ParseInt(fl[1][i+1:], 16, 32); err == nil && int(p) == port {
				inodes["socket:["+fl[9]+"]"] = true
			}
		}
	}
	return inodes
}
