package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/pkg/pki"
)

// BenchmarkFleetReads times what meshctl inspect and one look of rotate root -wait
// cost against an inventory of MESHCTL_BENCH_FLEET records (default 100,000), and
// how many messages the bus hands over for each (msgs/op): inspect-pod and
// inspect-serial run the command as a user does (the serial through the operator's
// API, served from the index of the same bucket); wait-look is one look of rotate
// root -wait (two pages of the operator's API); whole-read is inventory.Read, what
// each of them did before (the old inspect and every look of the old -wait read the
// bucket whole, then filtered); old-binary-inspect-pod, when MESHCTL_OLD_BIN names a
// meshctl built before the change, is that binary's inspect, process start included
// (new-binary-inspect-pod, MESHCTL_NEW_BIN, the same for the new one). Run:
//
//	go test -run '^$' -bench BenchmarkFleetReads -benchtime 5x ./cmd/meshctl/internal/cli/
func BenchmarkFleetReads(b *testing.B) {
	n := 100_000
	if v, err := strconv.Atoi(os.Getenv("MESHCTL_BENCH_FLEET")); err == nil && v > 0 {
		n = v
	}
	start := time.Now()
	bus := seedBus(b, n)
	b.Logf("seeded %d records in %s", n, time.Since(start).Round(time.Millisecond))
	api, _ := bus.operator(b)
	flags := []string{"-nats-url", bus.srv.ClientURL(), "-nats-nkey", bus.nk, "-operator", api}
	inspect := func(b *testing.B, what string) {
		var out bytes.Buffer
		env := Env{Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}
		if err := Run(context.Background(), env, append([]string{"inspect", what}, flags...)); err != nil {
			b.Fatalf("inspect %s: %v\n%s", what, err, out.String())
		}
	}
	measure := func(name string, op func(b *testing.B)) {
		b.Run(name, func(b *testing.B) {
			before := bus.delivered(b)
			for b.Loop() {
				op(b)
			}
			b.ReportMetric(float64(bus.delivered(b)-before)/float64(b.N), "msgs/op")
		})
	}
	measure("inspect-pod", func(b *testing.B) { inspect(b, "default/demo-7") })
	measure("inspect-serial", func(b *testing.B) { inspect(b, bus.target.Serial[:12]) })
	fp := pki.Fingerprint(bus.root.Cert)
	measure("wait-look", func(b *testing.B) {
		p, err := fleetProgress(context.Background(), &operatorAPI{base: api, timeout: time.Minute}, fp, time.Now())
		if err != nil || p.total != n {
			b.Fatalf("progress %+v: %v", p, err)
		}
	})
	measure("whole-read", func(b *testing.B) {
		snap, err := inventory.Read(context.Background(), bus.nc)
		if err != nil || len(snap.Find("default/demo-7")) != 1 {
			b.Fatalf("whole read: %d certificates, %v", len(snap.Certs), err)
		}
	})
	if old := os.Getenv("MESHCTL_OLD_BIN"); old != "" {
		measure("old-binary-inspect-pod", func(b *testing.B) {
			out, err := exec.Command(old, "inspect", "default/demo-7", "-nats-url", bus.srv.ClientURL(), "-nats-nkey", bus.nk).CombinedOutput()
			if err != nil {
				b.Fatalf("%s inspect: %v\n%s", old, err, out)
			}
		})
		measure("new-binary-inspect-pod", func(b *testing.B) {
			out, err := exec.Command(os.Getenv("MESHCTL_NEW_BIN"), append([]string{"inspect", "default/demo-7"}, flags...)...).CombinedOutput()
			if err != nil {
				b.Fatalf("new binary inspect: %v\n%s", err, out)
			}
		})
	}
}
