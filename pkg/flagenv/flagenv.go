// Package flagenv binds command-line flags to environment variables so that every
// service reads its configuration in one place with one precedence: flags, then
// environment variables, then defaults.
//
// An environment variable becomes the flag's default; a flag given on the command
// line overrides it. A malformed environment value is reported by Parse, naming
// both the variable and the flag, instead of being silently ignored.
package flagenv

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Set is a flag.FlagSet whose defaults may come from the environment.
type Set struct {
	FS        *flag.FlagSet
	getenv    func(string) string
	errs      []error
	allowArgs bool
	meta      map[string]meta // by flag name
}

// meta is what Usage prints beside a flag: its env var and its own default
// (the flag's DefValue may hold the environment's value instead).
type meta struct {
	env, def string
}

// New returns a Set named name that reads environment variables through getenv
// (os.Getenv in main, a map lookup in tests).
func New(name string, getenv func(string) string) *Set {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	return &Set{FS: fs, getenv: getenv, meta: map[string]meta{}}
}

// usage records name's env var and default for Usage and returns the help text.
func (s *Set) usage(usage, name, env string, def any) string {
	d := fmt.Sprint(def)
	if _, ok := def.(string); ok {
		d = strconv.Quote(d)
	}
	s.meta[name] = meta{env: env, def: d}
	return usage
}

func (s *Set) lookup(env string) (string, bool) {
	if env == "" {
		return "", false
	}
	v := s.getenv(env)
	return v, v != ""
}

func (s *Set) bad(env, name, v string, err error) {
	s.errs = append(s.errs, fmt.Errorf("env %s (flag -%s): invalid value %q: %w", env, name, v, err))
}

// String defines a string flag whose default is env's value when set, else def.
func (s *Set) String(p *string, name, env, def, usage string) {
	usage = s.usage(usage, name, env, def)
	if v, ok := s.lookup(env); ok {
		def = v
	}
	s.FS.StringVar(p, name, def, usage)
}

// Bool defines a bool flag whose default is env's value when set, else def.
func (s *Set) Bool(p *bool, name, env string, def bool, usage string) {
	usage = s.usage(usage, name, env, def)
	if v, ok := s.lookup(env); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			s.bad(env, name, v, err)
		} else {
			def = b
		}
	}
	s.FS.BoolVar(p, name, def, usage)
}

// Int defines an int flag whose default is env's value when set, else def.
func (s *Set) Int(p *int, name, env string, def int, usage string) {
	usage = s.usage(usage, name, env, def)
	if v, ok := s.lookup(env); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			s.bad(env, name, v, err)
		} else {
			def = n
		}
	}
	s.FS.IntVar(p, name, def, usage)
}

// Float64 defines a float flag whose default is env's value when set, else def.
func (s *Set) Float64(p *float64, name, env string, def float64, usage string) {
	usage = s.usage(usage, name, env, def)
	if v, ok := s.lookup(env); ok {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			s.bad(env, name, v, err)
		} else {
			def = f
		}
	}
	s.FS.Float64Var(p, name, def, usage)
}

// Duration defines a duration flag whose default is env's value when set, else def.
// Like Istio, a bare integer in the environment is not accepted: units are required.
func (s *Set) Duration(p *time.Duration, name, env string, def time.Duration, usage string) {
	usage = s.usage(usage, name, env, def)
	if v, ok := s.lookup(env); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			s.bad(env, name, v, err)
		} else {
			def = d
		}
	}
	s.FS.DurationVar(p, name, def, usage)
}

// List defines a comma-separated list flag (spaces around items and empty items
// dropped) whose default is env's value when set, else def.
func (s *Set) List(p *[]string, name, env string, def []string, usage string) {
	v := strings.Join(def, ",")
	usage = s.usage(usage, name, env, v)
	if e, ok := s.lookup(env); ok {
		v = e
	}
	*p = SplitList(v)
	s.FS.Var((*listValue)(p), name, usage)
}

// listValue is a List flag's value.
type listValue []string

func (l *listValue) Set(v string) error {
	*l = SplitList(v)
	return nil
}

func (l *listValue) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, ",")
}

// Parse parses args and reports every malformed environment value together with
// any command-line error. For -h or -help it returns only a *HelpError (matching
// flag.ErrHelp) that carries Usage's text: see PrintHelp.
func (s *Set) Parse(args []string) error {
	err := s.FS.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		var b strings.Builder
		s.Usage(&b)
		return &HelpError{Usage: b.String()}
	}
	if err != nil {
		s.errs = append(s.errs, err)
	}
	if s.FS.NArg() > 0 && !s.allowArgs {
		s.errs = append(s.errs, fmt.Errorf("unexpected arguments: %v", s.FS.Args()))
	}
	return errors.Join(s.errs...)
}

// AllowArgs lets Parse accept positional arguments (read them from FS.Args()).
func (s *Set) AllowArgs() { s.allowArgs = true }

// Usage writes every flag to w, in name order: the flag and its type, its help,
// then its env var and its default. Flags defined on FS directly, not through
// Set, are printed without env var.
func (s *Set) Usage(w io.Writer) {
	fmt.Fprintf(w, "Usage of %s (a flag overrides its env var, which overrides the default):\n", s.FS.Name())
	s.FS.VisitAll(func(f *flag.Flag) {
		typ, help := flag.UnquoteUsage(f)
		line := "  -" + f.Name
		if typ != "" {
			line += " " + typ
		}
		m, ok := s.meta[f.Name]
		if !ok {
			m = meta{def: f.DefValue}
		}
		env := m.env
		if env == "" {
			env = "none"
		}
		fmt.Fprintf(w, "%s\n    \t%s\n    \tenv %s, default %s\n", line, strings.ReplaceAll(help, "\n", "\n    \t"), env, m.def)
	})
}

// HelpError is Parse's answer to -h: the usage text the caller should print
// before exiting successfully.
type HelpError struct {
	Usage string
}

func (e *HelpError) Error() string { return "help requested" }

// Unwrap makes errors.Is(err, flag.ErrHelp) true.
func (e *HelpError) Unwrap() error { return flag.ErrHelp }

// PrintHelp reports whether err (possibly wrapped or joined) is a request for
// help; if so it writes the usage to w. A main then exits 0:
//
//	if err := run(ctx, os.Args[1:], os.Getenv); err != nil {
//		if flagenv.PrintHelp(err, os.Stdout) {
//			return
//		}
//		...
func PrintHelp(err error, w io.Writer) bool {
	var h *HelpError
	if !errors.As(err, &h) {
		return false
	}
	fmt.Fprint(w, h.Usage)
	return true
}

// Problems collects what a config's Validate finds, so that it reports every
// problem at once (errors.Join), each naming its flag. The zero value is ready.
type Problems struct{ errs []error }

// Check records the problem format describes unless ok.
func (p *Problems) Check(ok bool, format string, a ...any) {
	if !ok {
		p.errs = append(p.errs, fmt.Errorf(format, a...))
	}
}

// Addf records the problem format describes.
func (p *Problems) Addf(format string, a ...any) { p.errs = append(p.errs, fmt.Errorf(format, a...)) }

// Add records err unless it is nil (what a part's own Validate found).
func (p *Problems) Add(err error) {
	if err != nil {
		p.errs = append(p.errs, err)
	}
}

// Err is every problem recorded, joined; nil when there is none.
func (p *Problems) Err() error { return errors.Join(p.errs...) }
