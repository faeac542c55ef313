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

// Source is one foreign trust domain to follow: a bundle endpoint URL or a
// static bundle file in SPIFFE JWKS form. An endpoint is authenticated by web PKI
// (the SPIFFE federation spec's https_web profile), or, with EndpointID, by SPIFFE
// (https_spiffe): its certificate must be an X509-SVID of EndpointID, verified
// against the domain's own bundle — the one last fetched, else Bootstrap.
type Source struct {
	TrustDomain spiffeid.TrustDomain
	URL         string // https bundle endpoint, or ""
	File        string // static bundle file, or ""
	// EndpointID is the endpoint's SPIFFE ID (https_spiffe), in TrustDomain; zero:
	// web PKI.
	EndpointID spiffeid.ID
	// Bootstrap is a bundle file of TrustDomain that authenticates an https_spiffe
	// endpoint until its first bundle is fetched (obtained out of band, once).
	Bootstrap string
}

// Where says where the bundle comes from, for people.
func (s Source) Where() string {
	switch {
	case s.File != "":
		return "file:" + s.File
	case !s.EndpointID.IsZero():
		return s.URL + " (https_spiffe " + s.EndpointID.String() + ")"
	}
	return s.URL
}

// ParseEndpoints reads Istio's SPIFFE_BUNDLE_ENDPOINTS form,
// "td|https://host/path||td2|https://host2/path", where an entry may name the
// endpoint's SPIFFE ID as a third field, "td|https://host/path|spiffe://td/id",
// for the https_spiffe profile (its bootstrap bundle comes from ParseFiles: see
// WithBootstraps). Every bad entry is reported.
func ParseEndpoints(s string) ([]Source, error) {
	return parsePairs(s, func(td spiffeid.TrustDomain, v string) (Source, error) {
		v, idText, spiffeAuth := strings.Cut(v, "|")
		u, err := url.Parse(v)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return Source{}, fmt.Errorf("%q is not an https URL", v)
		}
		src := Source{TrustDomain: td, URL: v}
		if spiffeAuth {
			id, err := spiffeid.FromString(strings.TrimSpace(idText))
			if err != nil {
				return Source{}, fmt.Errorf("endpoint SPIFFE ID %q: %w", idText, err)
			}
			if id.TrustDomain() != td {
				return Source{}, fmt.Errorf("endpoint SPIFFE ID %s is not in trust domain %s (its bundle is what authenticates it)", id, td)
			}
			src.EndpointID = id
		}
		return src, nil
	})
}

// WithBootstraps joins endpoints and files into the sources to follow: the file
// of a domain with an https_spiffe endpoint is that endpoint's bootstrap bundle,
// not a source of its own; such an endpoint without one, or a domain given both a
// web-PKI endpoint and a file, is an error.
func WithBootstraps(endpoints, files []Source) ([]Source, error) {
	byTD := map[spiffeid.TrustDomain]string{}
	for _, f := range files {
		byTD[f.TrustDomain] = f.File
	}
	var out []Source
	var errs []error
	used := map[spiffeid.TrustDomain]bool{}
	for _, e := range endpoints {
		file, ok := byTD[e.TrustDomain]
		switch {
		case !e.EndpointID.IsZero() && !ok:
			errs = append(errs, fmt.Errorf("%s: an https_spiffe endpoint needs the domain's bundle once, to authenticate it: give it in the bundle files (%s|/path)", e.TrustDomain, e.TrustDomain))
			continue
		case !e.EndpointID.IsZero():
			e.Bootstrap, used[e.TrustDomain] = file, true
		case ok:
			errs = append(errs, fmt.Errorf("%s: given both a web-PKI endpoint and a bundle file", e.TrustDomain))
			continue
		}
		out = append(out, e)
	}
	for _, f := range files {
		if !used[f.TrustDomain] {
			out = append(out, f)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
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
		td, err := ParseTrustDomain(name)
		if err != nil {
			errs = append(errs, fmt.Errorf("entry %d: trust domain: %w", i+1, err))
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
