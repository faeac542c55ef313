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
	"time"
)

// Set is a flag.FlagSet whose defaults may come from the environment.
type Set struct {
	FS        *flag.FlagSet
	getenv    func(string) string
	errs      []error
	allowArgs bool
}

// New returns a Set named name that reads environment variables through getenv
// (os.Getenv in main, a map lookup in tests).
func New(name string, getenv func(string) string) *Set {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	return &Set{FS: fs, getenv: getenv}
}

func (s *Set) usage(usage, env string) string {
	if env == "" {
		return usage
	}
	return fmt.Sprintf("%s (env %s)", usage, env)
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
	if v, ok := s.lookup(env); ok {
		def = v
	}
	s.FS.StringVar(p, name, def, s.usage(usage, env))
}

// Bool defines a bool flag whose default is env's value when set, else def.
func (s *Set) Bool(p *bool, name, env string, def bool, usage string) {
	if v, ok := s.lookup(env); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			s.bad(env, name, v, err)
		} else {
			def = b
		}
	}
	s.FS.BoolVar(p, name, def, s.usage(usage, env))
}

// Int defines an int flag whose default is env's value when set, else def.
func (s *Set) Int(p *int, name, env string, def int, usage string) {
	if v, ok := s.lookup(env); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			s.bad(env, name, v, err)
		} else {
			def = n
		}
	}
	s.FS.IntVar(p, name, def, s.usage(usage, env))
}

// Float64 defines a float flag whose default is env's value when set, else def.
func (s *Set) Float64(p *float64, name, env string, def float64, usage string) {
	if v, ok := s.lookup(env); ok {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			s.bad(env, name, v, err)
		} else {
			def = f
		}
	}
	s.FS.Float64Var(p, name, def, s.usage(usage, env))
}

// Duration defines a duration flag whose default is env's value when set, else def.
// Like Istio, a bare integer in the environment is not accepted: units are required.
func (s *Set) Duration(p *time.Duration, name, env string, def time.Duration, usage string) {
	if v, ok := s.lookup(env); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			s.bad(env, name, v, err)
		} else {
			def = d
		}
	}
	s.FS.DurationVar(p, name, def, s.usage(usage, env))
}

// Parse parses args and reports every malformed environment value together with
// any command-line error.
func (s *Set) Parse(args []string) error {
	err := s.FS.Parse(args)
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

// Usage writes the flag defaults to w.
func (s *Set) Usage(w io.Writer) {
	s.FS.SetOutput(w)
	s.FS.PrintDefaults()
	s.FS.SetOutput(io.Discard)
}
