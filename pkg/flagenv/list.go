package flagenv

import "strings"

// SplitList splits a comma-separated flag value into its items, trimmed of spaces,
// leaving out empty ones: "a, b,,c " is [a b c], "" is nil.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
