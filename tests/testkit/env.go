package testkit

import "github.com/meshagent/meshagent/pkg/flagenv"

// Env is a getenv that reads m (nil: an empty environment), for loading a
// service's config in a test without the process's environment; it lists m's
// names as the process's getenv does (flagenv.NamesVar).
func Env(m map[string]string) func(string) string {
	return flagenv.Map(m)
}
