package flagenv

import (
	"os"
	"slices"
	"strings"
)

// NamesVar is the name under which a getenv that can list its environment answers
// with the names of its variables, NUL-separated. No environment variable is named
// so (a name holds no '=', a value no NUL), so a getenv that cannot list answers ""
// and Names finds nothing. Istio passes every ISTIO_META_* variable on as node
// metadata: a role that does the same lists them through the one getenv it is given.
const NamesVar = "="

// OS is os.Getenv that also lists the process's environment under NamesVar:
// what lifecycle.Main hands a service.
func OS(k string) string {
	if k != NamesVar {
		return os.Getenv(k)
	}
	env := os.Environ()
	names := make([]string, 0, len(env))
	for _, kv := range env {
		if n, _, ok := strings.Cut(kv, "="); ok && n != "" {
			names = append(names, n)
		}
	}
	return strings.Join(names, "\x00")
}

// Map is a getenv over m that lists its names under NamesVar.
func Map(m map[string]string) func(string) string {
	return func(k string) string {
		if k != NamesVar {
			return m[k]
		}
		names := make([]string, 0, len(m))
		for n := range m {
			names = append(names, n)
		}
		return strings.Join(names, "\x00")
	}
}

// Names returns the names getenv lists (see NamesVar) that begin with prefix and
// have a non-empty value, sorted; none when getenv cannot list.
func Names(getenv func(string) string, prefix string) []string {
	if getenv == nil {
		return nil
	}
	var out []string
	for n := range strings.SplitSeq(getenv(NamesVar), "\x00") {
		if n != "" && strings.HasPrefix(n, prefix) && getenv(n) != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}
