package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats.go"
)

// minP99Samples is the fewest latencies a p99 is reported from: below it the 99th
// percentile is a handful of samples, and says more about the machine than the signer.
const minP99Samples = 2000

// Sign subjects: where bench sign's requests go.
const (
	SubjectAny = "any" // sign.any, on the Dial connection
	SubjectPod = "pod" // each requester connected as its token's pod, on its sign.pod subject
	SubjectID  = "id"  // the same, on its identity subject
)

// SignConfig is one `meshctl bench sign` run.
type SignConfig struct {
	// Stack is the local stack, nil when the flags name the bus and the tokens; Dir
	// is its directory, whose dev issuer mints the tokens without TokensFile.
	Stack *stackfile.Stack
	Dir   string
	// N requests are prepared and sent once each, or cycled through for Duration;
	// InFlight requesters send them, after Warmup requests not measured.
	N, InFlight, Warmup int
	Duration            time.Duration
	KeyAlg              pki.KeyAlg
	Encoding            events.Encoding
	// Namespace and ServiceAccount name the minted tokens (sa-0, sa-1, ...);
	// TokensFile holds pre-minted ones instead, one a line.
	Namespace, ServiceAccount, TokensFile string
	// SignerPID and SignerMetrics say where the signer's CPU is read (default: the
	// local stack's).
	SignerPID     int
	SignerMetrics string
	// Subject is SubjectAny, SubjectPod or SubjectID. Any sends on the connection
	// Dial makes; pod and id connect to NATSURL (TLSCA) as each token's pod.
	Subject        string
	NATSURL, TLSCA string
	Dial           func(context.Context) (*nats.Conn, error)
	// RequestTimeout bounds one request's wait for its answer (0:
	// DefaultRequestTimeout); one request unanswered by then ends the run.
	RequestTimeout time.Duration
}

// DefaultRequestTimeout is -request-timeout's default: ample on a quiet machine;
// a test on a loaded one (load 20–50) gives more.
const DefaultRequestTimeout = 30 * time.Second

// Validate reports every bad value at once, naming its flag.
func (c SignConfig) Validate() error {
	var errs []error
	if c.N < 1 {
		errs = append(errs, errors.New("-n: at least 1"))
	}
	if c.InFlight < 1 || c.InFlight > 4096 {
		errs = append(errs, errors.New("-in-flight: want 1 to 4096"))
	}
	if c.Warmup < 0 {
		errs = append(errs, errors.New("-warmup: must not be negative"))
	}
	if c.Duration < 0 {
		errs = append(errs, errors.New("-duration: must not be negative"))
	}
	if c.RequestTimeout < 0 {
		errs = append(errs, errors.New("-request-timeout: must not be negative"))
	}
	if c.Subject != SubjectAny && c.Subject != SubjectPod && c.Subject != SubjectID {
		errs = append(errs, fmt.Errorf("-subject: %q, want any, pod or id", c.Subject))
	}
	return errors.Join(errs...)
}

// SignResult is what `meshctl bench sign` measured (its -o json form).
type SignResult struct {
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

// WriteText prints r for a person.
func (r SignResult) WriteText(w io.Writer) {
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

// Sign loads a signer over NATS: CSRs and tokens are made before the clock
// starts, then cfg.InFlight requesters send them on the sign subject until cfg.N
// are answered (or cfg.Duration has passed, cycling through the N prepared
// requests).
func Sign(ctx context.Context, cfg SignConfig) (SignResult, error) {
	toks, mint, err := benchTokens(cfg)
	if err != nil {
		return SignResult{}, err
	}
	cpu := signerCPU(cfg.SignerPID, cfg.SignerMetrics, cfg.Stack)
	conns, toks, subjectOf, err := signConns(ctx, cfg, toks)
	if err != nil {
		return SignResult{}, err
	}
	defer closeAll(conns)
	pool, err := newSignPool(cfg.KeyAlg, cfg.Encoding, toks, cfg.N, subjectOf)
	if err != nil {
		return SignResult{}, err
	}
	pool.timeout = cfg.RequestTimeout
	if cfg.Subject == SubjectAny {
		// Past the first n, a request asks as an identity of its own: a token
		// asking again within a minute would soon meet the signer's limit on early
		// certificates per identity (-max-early-certs-per-minute).
		pool.mint = mint
	}
	if cfg.Warmup > 0 {
		// Requests of their own: the run's would be repeats, answered unsigned.
		warm, err := newSignPool(cfg.KeyAlg, cfg.Encoding, toks, min(cfg.Warmup, cfg.N), subjectOf)
		if err != nil {
			return SignResult{}, err
		}
		warm.timeout = cfg.RequestTimeout
		if _, err := loadSign(ctx, conns, warm, len(warm.msgs), 0, cfg.InFlight); err != nil {
			return SignResult{}, fmt.Errorf("warmup: %w", err)
		}
	}
	return measureSign(ctx, cfg, conns, pool, cpu)
}

// signConns connects the requesters: the one Dial connection (SubjectAny), or
// one as the pod of each of the first InFlight tokens, which are then the tokens
// used. subjectOf is request i's subject.
func signConns(ctx context.Context, cfg SignConfig, toks []string) (conns []*nats.Conn, used []string, subjectOf func(int) string, err error) {
	if cfg.Subject == SubjectAny {
		nc, err := cfg.Dial(ctx)
		if err != nil {
			return nil, nil, nil, err
		}
		return []*nats.Conn{nc}, toks, func(int) string { return events.SubjectSignAny }, nil
	}
	toks = toks[:min(cfg.InFlight, len(toks))]
	subjects, conns, err := podConns(cfg.NATSURL, cfg.TLSCA, toks, cfg.Subject)
	if err != nil {
		closeAll(conns)
		return nil, nil, nil, err
	}
	return conns, toks, func(i int) string { return subjects[i%len(subjects)] }, nil
}

// measureSign sends pool's requests and measures them, with the signer's and this
// process's CPU around the run.
func measureSign(ctx context.Context, cfg SignConfig, conns []*nats.Conn, pool *signPool, cpu cpuReader) (SignResult, error) {
	cpu0, cpuErr := cpu.read()
	self0, selfErr := procCPUSeconds(os.Getpid())
	start := time.Now()
	lat, err := loadSign(ctx, conns, pool, len(pool.msgs), cfg.Duration, cfg.InFlight)
	elapsed := time.Since(start)
	if err != nil {
		return SignResult{}, err
	}
	res := SignResult{CSRs: len(lat), InFlight: cfg.InFlight, KeyAlg: string(cfg.KeyAlg), Seconds: elapsed.Seconds(), Rate: float64(len(lat)) / elapsed.Seconds()}
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
	return res, nil
}
