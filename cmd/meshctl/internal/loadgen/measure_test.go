package loadgen

import (
	"os"
	"strings"
	"testing"
)

func TestSignerCPUReaders(t *testing.T) {
	v, err := parseCPUSeconds(strings.NewReader("# HELP x\nprocess_cpu_seconds_total_bogus 9\nprocess_cpu_seconds_total 12.5\n"))
	if err != nil || v != 12.5 {
		t.Fatalf("parse metrics: %v %v", v, err)
	}
	if _, err := parseCPUSeconds(strings.NewReader("go_goroutines 3\n")); err == nil {
		t.Fatal("metrics without the counter accepted")
	}
	// This process burns CPU, so its own /proc reading is a positive number.
	s, err := procCPUSeconds(os.Getpid())
	for sum := 0; err == nil && s == 0; sum++ {
		for i := range 1 << 20 {
			sink += i ^ sum
		}
		s, err = procCPUSeconds(os.Getpid())
	}
	if err != nil || s <= 0 {
		t.Fatalf("/proc self: %v %v", s, err)
	}
}

var sink int
