package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
)

// BenchmarkUp is meshctl up with N demo pods, the real binaries (MESHAGENT_BIN, or
// built by TestMain): up_s is the time from Start until it returns — every pod
// holding its certificate, its Envoy ready and each process's /readyz answering;
// certs_s is the time until the last pod's first cert.issued.
func BenchmarkUp(b *testing.B) {
	for _, n := range []int{1, 10, 50} {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			var up, certs time.Duration
			b.StopTimer() // upOnce times Start alone
			for range b.N {
				u, c := upOnce(b, n)
				up += u
				certs += c
			}
			b.ReportMetric(up.Seconds()/float64(b.N), "up_s")
			b.ReportMetric(certs.Seconds()/float64(b.N), "certs_s")
		})
	}
}

// upOnce starts a stack of n pods in a fresh directory and stops it.
func upOnce(b *testing.B, n int) (up, certs time.Duration) {
	b.Helper()
	var (
		mu    sync.Mutex
		last  time.Time
		pods  = map[string]bool{}
		began time.Time
	)
	onEvent := func(m *nats.Msg) {
		if m.Subject != events.SubjectCertIssued {
			return
		}
		ev, _, err := events.Decode[events.CertIssued](m)
		if err != nil || ev.Pod.IsZero() {
			return
		}
		mu.Lock()
		if !pods[ev.Pod.String()] {
			pods[ev.Pod.String()], last = true, time.Now()
		}
		mu.Unlock()
	}
	r, err := devstack.New(devstack.Config{Dir: testkit.ShortDir(b), BinDir: binDir, TrustDomain: "cluster.local", Pods: n,
		LeafTTL: time.Hour, RootTTL: 24 * time.Hour, NATSPort: -1, OnEvent: onEvent}, io.Discard, hclog.NewNullLogger())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b.StartTimer()
	began = time.Now()
	err = r.Start(ctx)
	up = time.Since(began)
	b.StopTimer()
	defer r.Stop()
	if err != nil {
		b.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(pods) != n {
		b.Fatalf("%d of %d pods got a certificate", len(pods), n)
	}
	return up, last.Sub(began)
}
