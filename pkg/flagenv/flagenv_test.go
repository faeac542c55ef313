package flagenv

import (
	"errors"
	"flag"
	"fmt"
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

func TestHelpPrintsEveryFlagWithEnvAndDefault(t *testing.T) {
	// The env var's value must not show as the default: the default is the code's.
	s := New("svc", func(k string) string { return map[string]string{"ADDR": "10.0.0.1:1"}[k] })
	var addr, plain string
	var ttl time.Duration
	var on bool
	s.String(&addr, "addr", "ADDR", "127.0.0.1:9", "listen address")
	s.Duration(&ttl, "ttl", "TTL", time.Hour, "certificate lifetime")
	s.Bool(&on, "on", "", false, "a flag with no env var")
	s.FS.StringVar(&plain, "raw", "x", "defined on FS directly")
	err := s.Parse([]string{"-ttl", "2h", "-h"})
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Parse(-h) = %v, want flag.ErrHelp", err)
	}
	var b strings.Builder
	if !PrintHelp(fmt.Errorf("load config: %w", errors.Join(err, errors.New("other"))), &b) {
		t.Fatal("PrintHelp did not see the wrapped help request")
	}
	want := `Usage of svc (a flag overrides its env var, which overrides the default):
  -addr string
    	listen address
    	env ADDR, default "127.0.0.1:9"
  -on
    	a flag with no env var
    	env none, default false
  -raw string
    	defined on FS directly
    	env none, default x
  -ttl duration
    	certificate lifetime
    	env TTL, default 1h0m0s
`
	if got := b.String(); got != want {
		t.Fatalf("usage:\n%s\nwant:\n%s", got, want)
	}
	if PrintHelp(errors.New("bad flag"), &b) || PrintHelp(nil, &b) {
		t.Fatal("PrintHelp took a non-help error for help")
	}
}

func TestListSplitsAndKeepsPrecedence(t *testing.T) {
	tests := []struct {
		name string
		env  string
		args []string
		want string
	}{
		{"default", "", nil, "a|b"},
		{"env over default, spaces and empty items dropped", " x , ,y ", nil, "x|y"},
		{"flag over env", "x", []string{"-l", "p,q,"}, "p|q"},
		{"empty flag: no items", "x", []string{"-l", ""}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New("x", func(k string) string {
				if k == "L" {
					return tt.env
				}
				return ""
			})
			var l []string
			s.List(&l, "l", "L", []string{"a", "b"}, "a list")
			if err := s.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(l, "|"); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
			var b strings.Builder
			s.Usage(&b)
			if !strings.Contains(b.String(), `env L, default "a,b"`) {
				t.Fatalf("usage:\n%s", b.String())
			}
		})
	}
}

func TestProblemsReportsEveryOneRecorded(t *testing.T) {
	var p Problems
	if p.Err() != nil {
		t.Fatal("no problem recorded, yet an error")
	}
	inner := errors.New("-log-level: bad")
	p.Check(true, "-a: never")
	p.Check(false, "-b: %d is too small", 1)
	p.Addf("-c: %w", inner)
	p.Add(nil)
	p.Add(errors.New("-d: bad"))
	err := p.Err()
	if err == nil || !errors.Is(err, inner) || err.Error() != "-b: 1 is too small\n-c: -log-level: bad\n-d: bad" {
		t.Fatalf("err = %v", err)
	}
}
