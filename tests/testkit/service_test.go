package testkit

import (
	"os"
	"strings"
	"testing"
)

func TestStartServiceReportsAServiceThatExitsWithItsOutput(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a service")
	}
	r := &recorder{TB: t}
	StartService(r, "rotator", []string{"-no-such-flag"})
	if !strings.Contains(r.failed, "rotator exited before it was ready") || !strings.Contains(r.failed, "no-such-flag") {
		t.Fatalf("failure = %q, want the exit and the service's complaint", r.failed)
	}
}

func TestProcCPUAndStatusReadThisProcess(t *testing.T) {
	before, err := ProcCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for i := range 200_000_000 { // ~0.1 s of CPU
		x ^= i
	}
	after, err := ProcCPU(os.Getpid())
	if err != nil || after <= before {
		t.Fatalf("cpu %v then %v (%v), x %d", before, after, err, x)
	}
	if kb, err := ProcStatusKB(os.Getpid(), "VmRSS"); err != nil || kb < 1000 {
		t.Fatalf("VmRSS %v kB, %v", kb, err)
	}
	if _, err := ProcStatusKB(os.Getpid(), "NoSuchField"); err == nil {
		t.Fatal("a missing field read without an error")
	}
}
