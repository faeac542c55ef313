package cli

import (
	"bufio"
	"context"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats.go"
)

// minP99Samples is the fewest latencies a p99 is reported from: below it the 99th
// percentile is a handful of samples, and says more about the machine than the signer.
const minP99Samples = 2000

// SignBench is what `meshctl bench sign` measured (its -o json form).
type SignBench struct {
	CSRs     int     `json:"csrs"`
	InFlight int     `json:"in_flight"`
	KeyAlg   string  `json:"key_alg"`
	Seconds  float64 `json:"seconds"`
	Rate     float64 `json:"csrs_per_second"`
	P50Micro int64   `json:"p50_us"`
	// P99Micro is 0 (absent) when fewer than minP99Samples were measured.
	P99Micro int64 `json:"p99_us,omitempty"`
	// SignerCPUMicro is the signer's CPU time per CSR, when it could be read (from
	// /proc/<pid>/stat for a local signer, else its process_cpu_seconds_total).
	SignerCPUMicro float64 `json:"signer_cpu_us_per_csr,omitempty"`
	CPUSource      string  `json:"cpu_source,omitempty"`
	// ClientCPUMicro is this load client's own CPU time per CSR: on a machine it
	// shares with the signer, what the signer could not use.
	ClientCPUMicro float64 `json:"client_cpu_us_per_csr,omitempty"`
}

func runBench(ctx context.Context, env Env, args []string) error {
	switch {
	case len(args) > 0 && args[0] == "sign":
		return runBenchSign(ctx, env, args[1:])
	case len(args) > 0 && args[0] == "storm":
		return runBenchStorm(ctx, env, args[1:])
	}
	return fmt.Errorf("%w: bench sign [flags] | bench storm [flags]", errUsage)
}

// runBenchSign loads a signer over NATS: CSRs and tokens are made before the clock
// starts, then -in-flight requesters send them on the sign subject until -n are
// answered (or -duration has passed, cycling through the -n prepared requests).
func runBenchSign(ctx context.Context, env Env, args []string) error {
	var dir, alg, ns, sa, tokensFile, metricsURL, output, subject, encoding string
	var n, inFlight, warmup, pid int
	var dur time.Duration
	var bf busFlags
	fs := flagenv.New("bench sign", env.Getenv)
	dirFlag(fs, &dir)
	bf.bind(fs)
	fs.Int(&n, "n", "", 5000, "CSRs to prepare and send (with -duration: the keys cycled through, each time with a new CSR)")
	fs.Duration(&dur, "duration", "", 0, "run this long instead of sending each prepared CSR once")
	fs.Int(&inFlight, "in-flight", "", 32, "requests in flight at once")
	fs.Int(&warmup, "warmup", "", 200, "requests sent, and not measured, before the run")
	fs.String(&alg, "key-alg", "", string(pki.ECP256), "key algorithm of the CSRs")
	fs.String(&ns, "ns", "", events.BenchNamespace, "namespace of the minted tokens; in "+events.BenchNamespace+" (the default) the certificates are kept out of fleet counts (status, certs, the dashboard) and out of meshctl up's event print")
	fs.String(&sa, "sa", "", "load", "service account of the minted tokens (one per request: sa-0, sa-1, ...)")
	fs.String(&tokensFile, "tokens", "", "", "pre-minted tokens, one per line, used round robin (default: minted from the local stack's dev issuer)")
	fs.Int(&pid, "signer-pid", "", 0, "pid of a local signer, whose CPU is read from /proc (default: the local stack's)")
	fs.String(&metricsURL, "signer-metrics", "", "", "the signer's /metrics URL, for its process_cpu_seconds_total when it is not local (default: the local stack's)")
	fs.String(&output, "o", "", "text", "output: text or json")
	fs.String(&subject, "subject", "", "any", "where requests go: any (sign.any, as the -nats-* user); pod or id: each in-flight requester connects as the pod its token is bound to (-tokens: pod-bound), admitted by the signer's auth callout, and signs on its sign.pod subject (token verified per request) or its sign.id subject (identity from the subject: signer run with -bus-sign-id)")
	fs.String(&encoding, "encoding", "", "compact", "how requests are encoded: compact (the sign subjects' one encoding; what sds-edge sends) or json (a CloudEvent: only to load a signer binary from before the compact encoding in an A/B run — a current signer refuses it)")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	ka, err := pki.ParseKeyAlg(alg)
	var errs []error
	if err != nil {
		errs = append(errs, fmt.Errorf("-key-alg: %w", err))
	}
	enc, err := events.ParseEncoding(encoding)
	if err != nil {
		errs = append(errs, fmt.Errorf("-encoding: %w", err))
	}
	if n < 1 {
		errs = append(errs, errors.New("-n: at least 1"))
	}
	if inFlight < 1 || inFlight > 4096 {
		errs = append(errs, errors.New("-in-flight: want 1 to 4096"))
	}
	if warmup < 0 {
		errs = append(errs, errors.New("-warmup: must not be negative"))
	}
	if dur < 0 {
		errs = append(errs, errors.New("-duration: must not be negative"))
	}
	if subject != "any" && subject != "pod" && subject != "id" {
		errs = append(errs, fmt.Errorf("-subject: %q, want any, pod or id", subject))
	}
	if output != "text" && output != "json" {
		errs = append(errs, fmt.Errorf("-o: %q, want text or json", output))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// The local stack is read unless the flags name a bus and the tokens.
	var st *stackfile.Stack
	if tokensFile == "" || bf.url == "" {
		if st, err = stackfile.Read(dir); err != nil {
			return fmt.Errorf("%w (without a local stack, give -nats-url and -tokens)", err)
		}
	}
	toks, mint, err := benchTokens(tokensFile, dir, st, ns, sa, n)
	if err != nil {
		return err
	}
	cpu := signerCPU(pid, metricsURL, st)
	var conns []*nats.Conn
	subjectOf := func(int) string { return events.SubjectSignAny }
	if subject == "any" {
		nc, err := bf.connect(ctx, st, "meshctl bench sign")
		if err != nil {
			return err
		}
		conns = append(conns, nc)
	} else {
		url := bf.url
		if url == "" {
			url = st.NATSURL
		}
		toks = toks[:min(inFlight, len(toks))]
		subjects, pconns, err := benchPods(url, bf.tlsCA, toks, subject)
		conns = pconns
		if err != nil {
			closeAll(conns)
			return err
		}
		subjectOf = func(i int) string { return subjects[i%len(subjects)] }
	}
	defer closeAll(conns)
	pool, err := benchRequests(ka, enc, toks, n, subjectOf)
	if err != nil {
		return err
	}
	if subject == "any" {
		// Past the first n, a request asks as an identity of its own: a token
		// asking again within a minute would soon meet the signer's limit on early
		// certificates per identity (-max-early-certs-per-minute).
		pool.mint = mint
	}
	if warmup > 0 {
		// Requests of their own: the run's would be repeats, answered unsigned.
		warm, err := benchRequests(ka, enc, toks, min(warmup, n), subjectOf)
		if err != nil {
			return err
		}
		if _, err := loadSign(ctx, conns, warm, len(warm.msgs), 0, inFlight); err != nil {
			return fmt.Errorf("warmup: %w", err)
		}
	}
	cpu0, cpuErr := cpu.read()
	self0, selfErr := procCPUSeconds(os.Getpid())
	start := time.Now()
	lat, err := loadSign(ctx, conns, pool, len(pool.msgs), dur, inFlight)
	elapsed := time.Since(start)
	if err != nil {
		return err
	}
	res := SignBench{CSRs: len(lat), InFlight: inFlight, KeyAlg: string(ka), Seconds: elapsed.Seconds(), Rate: float64(len(lat)) / elapsed.Seconds()}
	res.P50Micro = lat[len(lat)/2].Microseconds()
	if len(lat) >= minP99Samples {
		res.P99Micro = lat[len(lat)*99/100].Microseconds()
	}
	if cpu1, err := cpu.read(); cpuErr == nil && err == nil {
		res.SignerCPUMicro, res.CPUSource = (cpu1-cpu0)*1e6/float64(len(lat)), cpu.source()
	}
	if self1, err := procCPUSeconds(os.Getpid()); selfErr == nil && err == nil {
		res.ClientCPUMicro = (self1 - self0) * 1e6 / float64(len(lat))
	}
	if output == "json" {
		return json.NewEncoder(env.Stdout).Encode(res)
	}
	printSignBench(env.Stdout, res)
	return nil
}

func printSignBench(w io.Writer, r SignBench) {
	fmt.Fprintf(w, "signed      %d CSRs (%s) in %.2fs, %d in flight\nrate        %.0f CSRs/s\n", r.CSRs, r.KeyAlg, r.Seconds, r.InFlight, r.Rate)
	p99 := fmt.Sprintf("n/a (fewer than %d samples)", minP99Samples)
	if r.P99Micro > 0 {
		p99 = (time.Duration(r.P99Micro) * time.Microsecond).String()
	}
	fmt.Fprintf(w, "latency     p50 %s, p99 %s\n", time.Duration(r.P50Micro)*time.Microsecond, p99)
	if r.CPUSource != "" {
		fmt.Fprintf(w, "signer CPU  %.0f µs per CSR (%s)\n", r.SignerCPUMicro, r.CPUSource)
	} else {
		fmt.Fprintln(w, "signer CPU  unknown (give -signer-pid or -signer-metrics)")
	}
	if r.ClientCPUMicro > 0 {
		fmt.Fprintf(w, "client CPU  %.0f µs per CSR (this load generator)\n", r.ClientCPUMicro)
	}
}

// benchTokens reads n tokens from file (cycled when it holds fewer), or mints n
// from the local stack's dev issuer, one service account each, as a fleet holds
// them; with the dev issuer also mint, the token of the i-th such service account.
func benchTokens(file, dir string, st *stackfile.Stack, ns, sa string, n int) ([]string, func(i int) (string, error), error) {
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return nil, nil, fmt.Errorf("-tokens: %w", err)
		}
		defer f.Close()
		var toks []string
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 64<<10)
		for sc.Scan() {
			if t := strings.TrimSpace(sc.Text()); t != "" {
				toks = append(toks, t)
			}
		}
		if err := sc.Err(); err != nil {
			return nil, nil, fmt.Errorf("-tokens: %w", err)
		}
		if len(toks) == 0 {
			return nil, nil, fmt.Errorf("-tokens: %s holds no token", file)
		}
		return toks, nil, nil
	}
	iss, err := devtoken.Load(filepath.Join(dir, "issuer"))
	if err != nil {
		return nil, nil, fmt.Errorf("dev token issuer (or give -tokens): %w", err)
	}
	now := time.Now()
	mint := func(i int) (string, error) {
		return iss.Mint(ns, fmt.Sprintf("%s-%d", sa, i), st.TokenIssuer.Audience, time.Hour, now)
	}
	toks := make([]string, n)
	for i := range toks {
		if toks[i], err = mint(i); err != nil {
			return nil, nil, err
		}
	}
	return toks, mint, nil
}

func closeAll(conns []*nats.Conn) {
	for _, nc := range conns {
		nc.Close()
	}
}

// benchPods connects once per token as the pod it is bound to (the signer's auth
// callout admits it by the token) and returns each pod's sign subject: its pod
// subject (mode "pod") or its identity subject (mode "id"). The claims are read,
// not verified: the callout and the signer verify them.
func benchPods(url, tlsCA string, toks []string, mode string) ([]string, []*nats.Conn, error) {
	var subjects []string
	var conns []*nats.Conn
	for i, tok := range toks {
		sa, pod, err := tokenPod(tok)
		if err != nil {
			return nil, conns, fmt.Errorf("-tokens: token %d: %w", i+1, err)
		}
		subj, err := events.PodSignSubject(pod)
		if mode == "id" {
			subj, err = events.IdentitySignSubject(pod, sa)
		}
		if err != nil {
			return nil, conns, fmt.Errorf("-tokens: token %d: %w", i+1, err)
		}
		opts := []nats.Option{nats.Token(tok), nats.CustomInboxPrefix(policy.Inbox(policy.Pod, pod)), nats.Name("meshctl bench sign/pod/" + pod.String())}
		if tlsCA != "" {
			opts = append(opts, nats.RootCAs(tlsCA))
		}
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			return nil, conns, fmt.Errorf("connect as pod %s (admitted by the signer's auth callout): %w", pod, err)
		}
		conns = append(conns, nc)
		subjects = append(subjects, subj)
	}
	return subjects, conns, nil
}

// tokenPod reads the service account and pod (in the token's namespace) a
// Kubernetes token is bound to, without verifying it.
func tokenPod(tok string) (sa string, pod events.PodRef, err error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return "", pod, errors.New("not a JWT")
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", pod, fmt.Errorf("claims: %w", err)
	}
	var c struct {
		K8s struct {
			Namespace      string `json:"namespace"`
			ServiceAccount struct {
				Name string `json:"name"`
			} `json:"serviceaccount"`
			Pod struct {
				Name string `json:"name"`
			} `json:"pod"`
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return "", pod, fmt.Errorf("claims: %w", err)
	}
	if c.K8s.Pod.Name == "" {
		return "", pod, errors.New("not bound to a pod (no kubernetes.io.pod.name): -subject pod and id need pod-bound tokens")
	}
	return c.K8s.ServiceAccount.Name, events.PodRef{Namespace: c.K8s.Namespace, Name: c.K8s.Pod.Name}, nil
}

// signPool is n prepared sign requests encoded as enc, each with its own key's
// CSR, request i on subject(i) with token i modulo len(toks); request makes one
// more with a new CSR of a pool key. A request is never sent twice: the signer
// answers a repeated CSR with the certificate it already recorded for it (a retry
// after a lost answer), which costs it no signature.
type signPool struct {
	// mint, when set, is the token of the i-th identity: request i past the pool
	// asks as identity i.
	mint    func(i int) (string, error)
	msgs    []*nats.Msg
	keys    []crypto.Signer
	toks    []string
	alg     pki.KeyAlg
	enc     events.Encoding
	subject func(i int) string
}

// signPoolID is the identity the CSRs ask for: the signer names the certificate
// after the token, not the CSR.
const signPoolID = "spiffe://bench.invalid/ns/bench/sa/load"

func benchRequests(alg pki.KeyAlg, enc events.Encoding, toks []string, n int, subject func(i int) string) (*signPool, error) {
	p := &signPool{msgs: make([]*nats.Msg, n), keys: make([]crypto.Signer, n), toks: toks, alg: alg, enc: enc, subject: subject}
	for i := range p.msgs {
		key, err := pki.GenerateKey(alg)
		if err != nil {
			return nil, err
		}
		p.keys[i] = key
		if p.msgs[i], err = p.request(i, i); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// request makes the n-th request sent with pool entry i: a new CSR of i's key (a
// new signature: a CSR never seen before) and i's token, or, past the pool with
// mint set, the n-th identity's.
func (p *signPool) request(i, n int) (*nats.Msg, error) {
	csr, err := pki.NewCSR(p.keys[i], signPoolID)
	if err != nil {
		return nil, err
	}
	tok := p.toks[i%len(p.toks)]
	if n >= len(p.msgs) && p.mint != nil {
		if tok, err = p.mint(n); err != nil {
			return nil, err
		}
	}
	req := events.SignRequest{CSR: string(csr), Token: tok, KeyAlgorithm: string(p.alg)}
	return events.NewSignRequestMsg(p.subject(i), p.enc, "meshctl/bench", req)
}

// loadSign sends p's requests 0..count-1 (with dur set: until dur has passed, past
// the pool each with a new CSR of a pool key) with inFlight requesters and returns
// the sorted latencies. A refusal or a timeout ends the run with an error: a
// benchmark of failures measures nothing. Request m goes on conns[m%len(conns)]
// (its pod's connection, or the one).
func loadSign(ctx context.Context, conns []*nats.Conn, p *signPool, count int, dur time.Duration, inFlight int) ([]time.Duration, error) {
	var deadline time.Time
	if dur > 0 {
		deadline = time.Now().Add(dur)
	}
	var next atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	for range inFlight {
		wg.Go(func() {
			var mine []time.Duration
			defer func() { mu.Lock(); lat = append(lat, mine...); mu.Unlock() }()
			for {
				i := int(next.Add(1)) - 1
				if dur > 0 && time.Now().After(deadline) || dur == 0 && i >= count || ctx.Err() != nil {
					return
				}
				m := i % len(p.msgs)
				msg, err := p.msgs[m], error(nil)
				if i >= len(p.msgs) {
					msg, err = p.request(m, i)
				}
				t := time.Now()
				if err == nil {
					err = signOnce(ctx, conns[m%len(conns)], msg)
				}
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(t))
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(lat) == 0 {
		return nil, errors.New("no request completed")
	}
	slices.Sort(lat)
	return lat, nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

func signOnce(ctx context.Context, nc *nats.Conn, m *nats.Msg) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		return fmt.Errorf("sign over nats: %w", err)
	}
	reply, _, err := events.DecodeSignReply(resp)
	if err != nil {
		return fmt.Errorf("sign reply: %w", err)
	}
	if reply.Error != nil {
		return fmt.Errorf("signer refused: %w", reply.Error)
	}
	return nil
}

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
		if st.Signer.HTTP != "" {
			metricsURL = "http://" + st.Signer.HTTP + "/metrics"
		}
	}
	if pid != 0 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/stat", pid)); err != nil {
			pid = 0 // not this machine's
		}
	}
	return cpuReader{pid: pid, metrics: metricsURL}
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return parseCPUSeconds(resp.Body)
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
