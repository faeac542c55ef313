package config

import (
	"strings"
	"testing"

	"github.com/meshagent/meshagent/tests/testkit"
)

// A foreign trust domain is configured only in its canonical form and never as
// this domain or one of its aliases, however written: the error names the flag
// and its environment variable, and the whole configuration is refused.
func TestFederationTrustDomainsValidated(t *testing.T) {
	base := []string{"-instance", "s", "-ca-kek-file", "kek"}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    []string
		follows string // with no error: the one domain followed
	}{
		{name: "home with a trailing dot", env: map[string]string{"SPIFFE_BUNDLE_ENDPOINTS": "cluster.local.|https://evil/b"},
			want: []string{"SPIFFE_BUNDLE_ENDPOINTS", `"cluster.local."`, "no trailing dot"}},
		{name: "home in upper case", env: map[string]string{"SPIFFE_BUNDLE_ENDPOINTS": "Cluster.Local|https://evil/b"},
			want: []string{"SPIFFE_BUNDLE_ENDPOINTS", "this signer's own trust domain"}},
		{name: "home as a SPIFFE ID", env: map[string]string{"SPIFFE_BUNDLE_ENDPOINTS": "spiffe://cluster.local|https://evil/b"},
			want: []string{"SPIFFE_BUNDLE_ENDPOINTS", "no scheme"}},
		{name: "a port", env: map[string]string{"SPIFFE_BUNDLE_ENDPOINTS": "west.example:443|https://w/b"},
			want: []string{"SPIFFE_BUNDLE_ENDPOINTS", "no port"}},
		{name: "an alias", env: map[string]string{"TRUST_DOMAIN_ALIASES": "old.local", "SPIFFE_BUNDLE_ENDPOINTS": "west.example|https://w/b||old.local|https://evil/b"},
			want: []string{"SPIFFE_BUNDLE_ENDPOINTS", "alias of this trust domain"}},
		{name: "a file for home", env: map[string]string{"SPIFFE_BUNDLE_FILES": "cluster.local|/etc/evil.json"},
			want: []string{"SPIFFE_BUNDLE_FILES", "own trust domain"}},
		{name: "a home domain not canonical", env: map[string]string{"TRUST_DOMAIN": "Cluster.local"},
			want: []string{"TRUST_DOMAIN", `write it as "cluster.local"`}},
		{name: "an alias not canonical", env: map[string]string{"TRUST_DOMAIN_ALIASES": "old.local."},
			want: []string{"TRUST_DOMAIN_ALIASES", "no trailing dot"}},
		{name: "bundle size limit", env: map[string]string{"SPIFFE_BUNDLE_MAX_SIZE": "10"},
			want: []string{"SPIFFE_BUNDLE_MAX_SIZE"}},
		{name: "upper case folded", env: map[string]string{"SPIFFE_BUNDLE_ENDPOINTS": "West.Example|https://w/b"}, follows: "west.example"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(base, testkit.Env(tc.env))
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				srcs, err := c.FederationSources()
				if err != nil || len(srcs) != 1 || srcs[0].TrustDomain.Name() != tc.follows {
					t.Fatalf("sources %+v, %v", srcs, err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
		})
	}
	c, err := Load(base, testkit.Env(nil))
	if err != nil || c.Federation.MaxBundleSize != 1<<20 {
		t.Fatalf("default bundle size limit %d, %v", c.Federation.MaxBundleSize, err)
	}
}
