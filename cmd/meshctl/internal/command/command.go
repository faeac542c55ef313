// Package command is the shape every meshctl command has, the operator's (cli) and
// the development stack's (devstack/compose) alike: what it gets from main, and how
// it reads its flags and answers -h.
package command

import (
	"context"
	"io"
	"strings"

	"github.com/meshagent/meshagent/pkg/flagenv"
)

// Env is what every command gets from main.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
}

// Command is one meshctl subcommand.
type Command struct {
	Name  string
	Usage string // one line for meshctl -h
	Run   func(ctx context.Context, env Env, args []string) error
}

// Parse parses args into fs. -h (or -help, --help) anywhere, even after a
// command's words (meshctl rotate pod demo-0 -h), asks for fs's flags: Parse then
// returns a *flagenv.HelpError, which lifecycle.Main prints before exiting 0.
func Parse(fs *flagenv.Set, args []string) error {
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			var b strings.Builder
			fs.Usage(&b)
			return &flagenv.HelpError{Usage: b.String()}
		}
	}
	return fs.Parse(args)
}
