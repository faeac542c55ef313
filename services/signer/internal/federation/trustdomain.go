package federation

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// maxTrustDomainLen is the SPIFFE ID spec's bound on a trust domain name.
const maxTrustDomainLen = 255

// ParseTrustDomain reads a trust domain name as an operator writes it in the
// configuration and returns it in its one canonical form, or says what is wrong:
// letters are lower-cased (a trust domain name is case-insensitive, like the DNS
// name it usually is, and SPIFFE IDs carry it in lower case); a scheme
// ("spiffe://td", "https://td"), a port, a path, a trailing dot ("td.", the
// DNS root), an empty label ("a..b", ".td") and any character outside SPIFFE's
// set are refused rather than mended, since each would otherwise name a second,
// different trust domain beside the one meant (go-spiffe takes "td." and
// "spiffe://td" as they are).
func ParseTrustDomain(s string) (spiffeid.TrustDomain, error) {
	name := strings.ToLower(strings.TrimSpace(s))
	switch {
	case name == "":
		return spiffeid.TrustDomain{}, errors.New("empty trust domain")
	case strings.Contains(name, "://") || strings.Contains(name, ":/"):
		return spiffeid.TrustDomain{}, fmt.Errorf("%q: a trust domain is a bare name, no scheme (write %q)", s, bareName(name))
	case strings.Contains(name, "/"):
		return spiffeid.TrustDomain{}, fmt.Errorf("%q: a trust domain has no path", s)
	case strings.Contains(name, ":"):
		return spiffeid.TrustDomain{}, fmt.Errorf("%q: a trust domain has no port", s)
	case strings.HasSuffix(name, "."):
		return spiffeid.TrustDomain{}, fmt.Errorf("%q: a trust domain has no trailing dot (write %q)", s, strings.TrimRight(name, "."))
	case strings.HasPrefix(name, ".") || strings.Contains(name, ".."):
		return spiffeid.TrustDomain{}, fmt.Errorf("%q: empty label in trust domain", s)
	case len(name) > maxTrustDomainLen:
		return spiffeid.TrustDomain{}, fmt.Errorf("trust domain of %d bytes, SPIFFE allows %d", len(name), maxTrustDomainLen)
	}
	td, err := spiffeid.TrustDomainFromString(name)
	if err != nil {
		return spiffeid.TrustDomain{}, fmt.Errorf("%q: %w", s, err)
	}
	return td, nil
}

// CanonicalTrustDomain checks that s is already a trust domain's canonical form
// (ParseTrustDomain(s) is s): the home domain and its aliases are compared as
// strings by every pod, so they are never mended, only refused.
func CanonicalTrustDomain(s string) error {
	td, err := ParseTrustDomain(s)
	if err != nil {
		return err
	}
	if td.Name() != s {
		return fmt.Errorf("%q: write it as %q", s, td.Name())
	}
	return nil
}

// bareName strips a scheme and anything after the host from a URL-like name,
// for the hint in an error.
func bareName(s string) string {
	if _, rest, ok := strings.Cut(s, "://"); ok {
		s = rest
	}
	s, _, _ = strings.Cut(s, "/")
	s, _, _ = strings.Cut(s, ":")
	return strings.TrimRight(s, ".")
}
