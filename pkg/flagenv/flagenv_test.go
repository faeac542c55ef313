package flagenv

import (
	"strings"
	"testing"
	"time"
)

func TestPrecedence(t *testing.T) {
	env := map[string]string{"A": "from-env", "D": "3s", "N": "7"}
	tests := []struct {
		name  string
		args  []string
		wantA string
		wantD time.Duration
		wantN int
	}{
		{name: "env over default", args: nil, wantA: "from-env", wantD: 3 * time.Second, wantN: 7},
		{name: "flag over env", args: []string{"-a", "flag", "-d", "1m", "-n", "1"}, wantA: "flag", wantD: time.Minute, wantN: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New("x", func(k string) string { return env[k] })
			var a string
			var d time.Duration
			var n int
			s.String(&a, "a", "A", "def", "a")
			s.Duration(&d, "d", "D", time.Hour, "d")
			s.Int(&n, "n", "N", 0, "n")
			if err := s.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if a != tt.wantA || d != tt.wantD || n != tt.wantN {
				t.Fatalf("got %q %v %d, want %q %v %d", a, d, n, tt.wantA, tt.wantD, tt.wantN)
			}
		})
	}
}

func TestBadEnvReportedWithFlagName(t *testing.T) {
	env := map[string]string{"D": "soon", "B": "maybe"}
	s := New("x", func(k string) string { return env[k] })
	var d time.Duration
	var b bool
	s.Duration(&d, "ttl", "D", time.Hour, "")
	s.Bool(&b, "json", "B", false, "")
	err := s.Parse(nil)
	if err == nil {
		t.Fatal("want error")
	}
	for _, want := range []string{"env D (flag -ttl)", "env B (flag -json)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if d != time.Hour {
		t.Errorf("bad env changed the default: %v", d)
	}
}

func TestStrayArgumentsRejected(t *testing.T) {
	s := New("x", nil)
	if err := s.Parse([]string{"extra"}); err == nil {
		t.Fatal("want error for stray argument")
	}
}

func TestAllowArgsKeepsPositionals(t *testing.T) {
	s := New("x", nil)
	s.AllowArgs()
	var d string
	s.String(&d, "dir", "", "", "")
	if err := s.Parse([]string{"-dir", "a", "pod", "p1"}); err != nil {
		t.Fatal(err)
	}
	if d != "a" || len(s.FS.Args()) != 2 || s.FS.Arg(0) != "pod" {
		t.Fatalf("dir %q args %v", d, s.FS.Args())
	}
}
