package loadgen

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A storm's text starts with the line its runs are compared by.
func TestStormResultFirstLine(t *testing.T) {
	var b strings.Builder
	StormResult{Pods: 10, Certified: 9, Failed: 1, Wasted: 2, Seconds: 1.5, HubConns: 7}.WriteText(&b)
	if first, _, _ := strings.Cut(b.String(), "\n"); first != "pods=10 certified=9 failed=1 wasted=2 in 1.50 s hub_conns=7" {
		t.Fatalf("first line %q", first)
	}
	b.Reset()
	r := StormResult{Pods: 10, Certified: 10, WastedUnknown: true, Seconds: 1.5, HubConns: 7, Unread: []string{"signer metrics: refused"}}
	r.WriteText(&b)
	if first, _, _ := strings.Cut(b.String(), "\n"); first != "pods=10 certified=10 failed=0 wasted=unknown in 1.50 s hub_conns=7" {
		t.Fatalf("first line %q", first)
	}
	if !errors.Is(r.Err(), ErrUnread) || !strings.Contains(r.Err().Error(), "signer metrics") {
		t.Fatalf("a storm with a metric unread: error %v", r.Err())
	}
}

// The quantiles are the seconds from the start by which half, 90% and 99% of the
// pods were certified.
func TestQuantilesOfCertifiedTimes(t *testing.T) {
	start := time.UnixMilli(1_000_000)
	var times []int64
	for i := 100; i >= 1; i-- { // out of order, as workers report them
		times = append(times, start.UnixMilli()+int64(i)*100)
	}
	if got, want := quantiles(start, times), [3]float64{5.1, 9.1, 10}; got != want {
		t.Fatalf("quantiles %v, want %v", got, want)
	}
	if got := quantiles(start, nil); got != [3]float64{} {
		t.Fatalf("quantiles of none %v", got)
	}
}

// Every bad value is reported at once, naming its flag.
func TestConfigsNameEveryBadFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want []string
	}{
		{"storm", StormConfig{Layout: Layout{Pods: 0, ConnsPerPod: 4, Nodes: -1}, Rotate: "sideways", PodsPerWorker: -1, Procs: -1}.Validate(), []string{"-pods:", "-conns:", "-nodes:", "-timeout:", "-rotate:", "-pods-per-worker:", "-sim-procs:"}},
		{"storm in workers", StormConfig{Layout: Layout{Pods: 100, ConnsPerPod: 1, Nodes: 3}, Timeout: 1, Rotate: RotateNewKey, PodsPerWorker: 10}.Validate(), []string{"-rotate:", "-nodes:"}},
		{"sign", SignConfig{Warmup: -1, Duration: -1, Subject: "all"}.Validate(), []string{"-n:", "-in-flight:", "-warmup:", "-duration:", "-subject:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, w := range tc.want {
				if tc.err == nil || !strings.Contains(tc.err.Error(), w) {
					t.Errorf("error %v does not name %s", tc.err, w)
				}
			}
		})
	}
	if err := (StormConfig{Layout: Layout{Pods: 1, ConnsPerPod: 1}, Timeout: 1, Rotate: RotateNone}).Validate(); err != nil {
		t.Fatalf("a good storm config refused: %v", err)
	}
}

// The tally counts an error once whatever pod, address, file or record key it names:
// 486 records not stored in time were one kind, not 486 lines.
func TestErrKindFoldsAddressesFilesAndIDs(t *testing.T) {
	a := errKind("unavailable: could not record the certificate: publish $KV.meshagent-issued.2583a581222a12cfd49efa709067167c: not stored by its deadline: nats: timeout")
	b := errKind("unavailable: could not record the certificate: publish $KV.meshagent-issued.e687223023a554b11095a8b34005cf5: not stored by its deadline: nats: timeout")
	if a != b || !strings.Contains(a, "<id>") {
		t.Fatalf("two records' errors are two kinds: %q, %q", a, b)
	}
	// The control: different errors stay different kinds.
	if errKind("sign: context deadline exceeded") == errKind("sign: nats: no responders available for request") {
		t.Fatal("different errors folded together")
	}
	if got := errKind("dial tcp 127.0.0.1:4222: i/o timeout"); got != "dial tcp <addr>: i/o timeout" {
		t.Fatalf("address not folded: %q", got)
	}
}
