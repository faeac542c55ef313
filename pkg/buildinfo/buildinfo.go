// Package buildinfo is what a meshagent binary says it is: its version, set at
// build time by the Makefile (-ldflags -X .../pkg/buildinfo.Version=$(git describe)),
// else the VCS revision Go stamped into the binary, else "dev".
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
)

// Version is set at build time; empty means "ask the binary's build info".
var Version string

// Get is the binary's version: Version, else the VCS revision Go recorded (12 hex
// digits, "-dirty" when the tree had changes), else "dev".
func Get() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "dev"
	}
	rev = rev[:min(12, len(rev))]
	if dirty {
		rev += "-dirty"
	}
	return rev
}

// String is the line a binary prints for -version: "<name> <version> (<go>, <os>/<arch>)".
func String(name string) string {
	return fmt.Sprintf("%s %s (%s, %s/%s)", name, Get(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// Asked reports whether args ask for the version instead of a run: "-version" or
// "--version" anywhere, or "version" as the first word.
func Asked(args []string) bool {
	return len(args) > 0 && args[0] == "version" || slices.Contains(args, "-version") || slices.Contains(args, "--version")
}

// Header is the HTTP header a service's /healthz names its version in.
const Header = "X-Meshagent-Version"
