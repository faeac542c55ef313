// Package federation serves this trust domain's SPIFFE bundle at a bundle
// endpoint and follows the bundles of foreign trust domains, keeping each
// domain's roots apart. Bundle encoding, ID parsing and the endpoint protocol
// are go-spiffe's (spiffebundle, spiffeid, federation); this package decides
// what is served, what is followed and when it is refreshed.
package federation

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Source is one foreign trust domain to follow: a bundle endpoint URL (web-PKI
// authenticated) or a static bundle file in SPIFFE JWKS form.
type Source struct {
	TrustDomain spiffeid.TrustDomain
	URL         string // https bundle endpoint, or ""
	File        string // static bundle file, or ""
}

// Where says where the bundle comes from, for people.
func (s Source) Where() string {
	if s.File != "" {
		return "file:" + s.File
	}
	return s.URL
}

// ParseEndpoints reads Istio's SPIFFE_BUNDLE_ENDPOINTS form,
// "td|https://host/path||td2|https://host2/path". Every bad entry is reported.
func ParseEndpoints(s string) ([]Source, error) {
	return parsePairs(s, func(td spiffeid.TrustDomain, v string) (Source, error) {
		u, err := url.Parse(v)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return Source{}, fmt.Errorf("%q is not an https URL", v)
		}
		return Source{TrustDomain: td, URL: v}, nil
	})
}

// ParseFiles reads static bundle files in the same form, "td|/path||td2|/path2".
func ParseFiles(s string) ([]Source, error) {
	return parsePairs(s, func(td spiffeid.TrustDomain, v string) (Source, error) {
		if v == "" {
			return Source{}, errors.New("empty path")
		}
		return Source{TrustDomain: td, File: v}, nil
	})
}

func parsePairs(s string, mk func(spiffeid.TrustDomain, string) (Source, error)) ([]Source, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []Source
	var errs []error
	seen := map[spiffeid.TrustDomain]bool{}
	for i, entry := range strings.Split(s, "||") {
		name, val, ok := strings.Cut(strings.TrimSpace(entry), "|")
		if !ok {
			errs = append(errs, fmt.Errorf("entry %d %q: want trustdomain|value", i+1, entry))
			continue
		}
		td, err := spiffeid.TrustDomainFromString(strings.TrimSpace(name))
		if err != nil {
			errs = append(errs, fmt.Errorf("entry %d: trust domain %q: %w", i+1, name, err))
			continue
		}
		if seen[td] {
			errs = append(errs, fmt.Errorf("entry %d: trust domain %q given twice", i+1, td))
			continue
		}
		seen[td] = true
		src, err := mk(td, strings.TrimSpace(val))
		if err != nil {
			errs = append(errs, fmt.Errorf("entry %d (%s): %w", i+1, td, err))
			continue
		}
		out = append(out, src)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}
