package signer

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net/url"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/config"
	"github.com/meshagent/meshagent/services/signer/internal/signertest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// clients is how many requests are in flight end to end.
const clients = 32

// rounds of side-by-side measurement; the median is reported.
const rounds = 3

// BenchmarkSign measures the in-process crypto ceiling (parse and verify the CSR,
// create the certificate, encode PEM; GOMAXPROCS workers) and end-to-end signing over
// an in-process embedded NATS (JWT verification, the CloudEvents envelope, the
// cert.issued JetStream publish and the reply included) with 1 and 2 signer replicas,
// for P-256 and RSA-2048 CA keys. The machine is shared and noisy, so every
// end-to-end sub-benchmark alternates ceiling and end-to-end runs (rounds times) and
// reports medians: CSRs/s, p50/p99 latency, the ratio to the crypto ceiling and to
// the ceiling plus JWT verification, by wall-clock rate and by CPU time per CSR (the
// robust one on a shared machine: everything runs in this process). Each does its whole measurement once: run it
// with -benchtime 1x.
func BenchmarkSign(b *testing.B) {
	for _, tc := range []struct {
		alg pki.KeyAlg
		n   int // CSRs per run
	}{{pki.ECP256, 1500}, {pki.RSA2048, 400}} {
		b.Run(fmt.Sprintf("%s/ceiling", tc.alg), func(b *testing.B) {
			c := newCeiling(b, tc.alg, tc.n)
			var runs []result
			for range rounds {
				runs = append(runs, c.run(b, false))
			}
			median(runs).report(b)
		})
		for _, replicas := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/nats-%dreplica", tc.alg, replicas), func(b *testing.B) {
				c := newCeiling(b, tc.alg, tc.n)
				e2e := newEndToEnd(b, tc.alg, tc.n, replicas)
				var runs []result
				var ratio, ratioJWT, ratioCPU, ratioCPUJWT []float64
				for range rounds {
					crypto, withJWT, r := c.run(b, false), c.run(b, true), e2e.run(b)
					runs = append(runs, r)
					ratio = append(ratio, r.rate()/crypto.rate())
					ratioJWT = append(ratioJWT, r.rate()/withJWT.rate())
					ratioCPU = append(ratioCPU, float64(crypto.cpuPerCSR())/float64(r.cpuPerCSR()))
					ratioCPUJWT = append(ratioCPUJWT, float64(withJWT.cpuPerCSR())/float64(r.cpuPerCSR()))
				}
				m := median(runs)
				m.report(b)
				med := func(xs []float64) float64 { slices.Sort(xs); return xs[len(xs)/2] }
				b.ReportMetric(med(ratio), "ratio")
				b.ReportMetric(med(ratioJWT), "ratio-jwt")
				b.ReportMetric(med(ratioCPU), "ratio-cpu")
				b.ReportMetric(med(ratioCPUJWT), "ratio-cpu-jwt")
				b.Logf("%s, %d replica(s): %.0f CSRs/s end to end (p50 %s, p99 %s, %s CPU per CSR); median ratios to the crypto ceiling: wall %.2f, CPU %.2f; to crypto+jwt: wall %.2f, CPU %.2f",
					tc.alg, replicas, m.rate(), m.p(50), m.p(99), m.cpuPerCSR(), med(ratio), med(ratioCPU), med(ratioJWT), med(ratioCPUJWT))
			})
		}
	}
}

type result struct {
	lat     []time.Duration // sorted
	elapsed time.Duration
	cpu     time.Duration // process CPU time (user+sys) spent during the run
}

// cpuPerCSR is the process CPU time per CSR: unlike wall-clock rates it hardly moves
// when other processes load the machine.
func (r result) cpuPerCSR() time.Duration { return r.cpu / time.Duration(len(r.lat)) }

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (r result) rate() float64         { return float64(len(r.lat)) / r.elapsed.Seconds() }
func (r result) p(q int) time.Duration { return r.lat[len(r.lat)*q/100].Round(time.Microsecond) }
func median(rs []result) result {
	slices.SortFunc(rs, func(x, y result) int { return int(x.elapsed - y.elapsed) })
	return rs[len(rs)/2]
}

func (r result) report(b *testing.B) {
	b.ReportMetric(r.rate(), "CSRs/s")
	b.ReportMetric(float64(r.p(50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(r.p(99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(r.cpuPerCSR().Microseconds()), "cpu-µs/CSR")
	b.ReportMetric(0, "ns/op")
}

func csrs(b *testing.B, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		_, out[i] = signertest.CSR(b, pki.ECP256, "spiffe://cluster.local/ns/bench/sa/w")
	}
	return out
}

// tokens mints one token per request, as a fleet of n pods would hold.
func tokens(b *testing.B, iss *tokentest.Issuer, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = iss.Mint(b, iss.ServiceAccount("bench", fmt.Sprintf("w%d", i), time.Now().Add(-time.Second), 2*time.Hour))
	}
	return out
}

// parallel runs f(i) for i in [0, n) on workers goroutines and times each call.
func parallel(b *testing.B, n, workers int, f func(i int) error) result {
	r, err := measure(n, workers, f)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// measure is parallel without a testing.B (the confined ceiling runs it in a child
// process): the first error ends it.
func measure(n, workers int, f func(i int) error) (result, error) {
	runtime.GC()
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	cpu0, start := cpuTime(), time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t := time.Now()
				if err := f(i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				lat[i] = time.Since(t)
			}
		}()
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	if err, _ := firstErr.Load().(error); err != nil {
		return result{}, err
	}
	slices.Sort(lat)
	return result{lat: lat, elapsed: elapsed, cpu: cpu}, nil
}

// ceiling is the in-process crypto path with its inputs made in advance.
type ceiling struct {
	m        *ca.Material
	reqs     [][]byte
	tokens   []string
	verifier *authn.JWTVerifier
	id       *url.URL
}

func newCeiling(b *testing.B, alg pki.KeyAlg, n int) *ceiling {
	c, err := buildCeiling(alg, n)
	if err != nil {
		b.Fatal(err)
	}
	iss := tokentest.NewIssuer(b, "meshagent-dev")
	c.tokens = tokens(b, iss, n)
	c.verifier = &authn.JWTVerifier{Keys: authn.StaticKeySet(iss.JWKS()), Issuer: "meshagent-dev", Audience: "istio-ca", TrustDomain: "cluster.local"}
	return c
}

// buildCeiling makes the ceiling's CA (a self-signed root of alg) and n CSRs,
// without tokens: what the confined ceiling's child process needs.
func buildCeiling(alg pki.KeyAlg, n int) (*ceiling, error) {
	key, err := pki.GenerateKey(alg)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bench root"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	root, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	m, err := ca.NewMaterial(key, root, nil, []*x509.Certificate{root}, 1, now)
	if err != nil {
		return nil, err
	}
	id, _ := url.Parse("spiffe://cluster.local/ns/bench/sa/w")
	c := &ceiling{m: m, id: id, reqs: make([][]byte, n)}
	for i := range c.reqs {
		k, err := pki.GenerateKey(pki.ECP256)
		if err != nil {
			return nil, err
		}
		if c.reqs[i], err = pki.NewCSR(k, id.String()); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *ceiling) run(b *testing.B, withJWT bool) result {
	r, err := c.measure(withJWT)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// measure signs every CSR once on GOMAXPROCS workers: parse and verify the CSR,
// (verify the token,) create the certificate, encode it as PEM.
func (c *ceiling) measure(withJWT bool) (result, error) {
	now := time.Now()
	return measure(len(c.reqs), runtime.GOMAXPROCS(0), func(i int) error {
		csr, err := pki.ParseCSR(c.reqs[i])
		if err != nil {
			return err
		}
		id := c.id
		if withJWT {
			caller, err := c.verifier.Verify(c.tokens[i])
			if err != nil {
				return err
			}
			id = caller.ID
		}
		leaf, err := c.m.SignLeaf(csr.PublicKey, id, now, time.Hour)
		if err != nil {
			return err
		}
		_ = pki.EncodeCertPEM(leaf)
		return nil
	})
}

// endToEnd is an in-process embedded NATS (no TCP) with signer replicas on it and
// requests made in advance.
// endToEnd sends each round requests of its own: a request sent again would be a
// repeat, answered with the certificate already recorded for it, unsigned.
type endToEnd struct {
	client *nats.Conn
	rounds [][]*nats.Msg
	round  int
}

func newEndToEnd(b *testing.B, alg pki.KeyAlg, n, replicas int) *endToEnd {
	s, err := embedded.Start(embedded.Config{DontListen: true, StoreDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	connect := func() *nats.Conn {
		nc, err := nats.Connect("", nats.InProcessServer(s))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		return nc
	}
	iss := tokentest.NewIssuer(b, "meshagent-dev")
	jwks := iss.WriteJWKS(b, b.TempDir())
	kek := signertest.KEKFile(b) // replicas share one KEK, as a fleet's signers do
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	b.Cleanup(func() { cancel(); wg.Wait() })
	for r := range replicas {
		c := config.Default()
		c.Instance = fmt.Sprintf("bench-%d", r)
		c.Listen.HTTP, c.Listen.GRPC = "127.0.0.1:0", "127.0.0.1:0"
		c.Auth.JWKSFile = jwks
		c.CA.KEKFile = kek
		c.CA.KeyAlg = alg
		// Each pod signs many times a second here.
		c.Certs.MaxEarlyPerMinute = 0
		health := obs.NewServer(c.Listen.HTTP, hclog.NewNullLogger()) // not served: only its readiness is read
		svc, err := New(c, lifecycle.Deps{Bus: connect(), Metrics: health.Registry(), Health: health}.WithDefaults())
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = svc.Run(ctx) }()
		testkit.EventuallyWithin(b, 30*time.Second, "signer ready", func() bool { return health.Ready() == nil })
	}
	toks := tokens(b, iss, n)
	e := &endToEnd{client: connect(), rounds: make([][]*nats.Msg, rounds)}
	for r := range e.rounds {
		reqs := csrs(b, n)
		e.rounds[r] = make([]*nats.Msg, n)
		for i := range reqs {
			// A pod of the tokens' namespace: a pod is namespace and name, and the
			// signer refuses a pod outside its identity's namespace.
			pod := events.PodRef{Namespace: "bench", Name: fmt.Sprintf("pod-%d", i)}
			subject, err := events.PodSignSubject(pod)
			if err != nil {
				b.Fatal(err)
			}
			e.rounds[r][i], err = events.NewMsgOn(subject, "bench", events.SignRequest{CSR: string(reqs[i]), Token: toks[i], Pod: pod})
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	return e
}

// run sends the next round's requests.
func (e *endToEnd) run(b *testing.B) result {
	msgs := e.rounds[e.round%len(e.rounds)]
	e.round++
	return parallel(b, len(msgs), clients, func(i int) error {
		resp, err := e.client.RequestMsg(msgs[i], 30*time.Second)
		if err != nil {
			return err
		}
		rep, _, err := events.DecodeSignReply(resp)
		if err != nil {
			return err
		}
		if rep.Error != nil {
			return rep.Error
		}
		return nil
	})
}
