package secrets

import (
	"errors"
	"fmt"
	"sort"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/pkg/xdswire"
)

// SPIFFERootCA names the validation context that verifies a peer against the
// roots of the peer's own trust domain (Envoy's SPIFFE certificate validator):
// this domain's roots, each followed foreign domain's roots, and this domain's
// roots again under each trust domain alias. Plain ROOTCA (one PEM bundle)
// stays for clients that do not know the validator.
const SPIFFERootCA = sdsclient.ResourceSPIFFERootCA

// SPIFFEValidatorName is Envoy's name of the SPIFFE certificate validator.
const SPIFFEValidatorName = xdswire.SPIFFEValidatorName

// SPIFFEValidation builds the SPIFFERootCA secret from PEM roots by trust
// domain. Every name must be a trust domain and every bundle non-empty.
func SPIFFEValidation(bundles map[string][]byte) (xdswire.Secret, error) {
	if len(bundles) == 0 {
		return xdswire.Secret{}, errors.New("spiffe validation: no trust domain")
	}
	names := make([]string, 0, len(bundles))
	for n := range bundles {
		names = append(names, n)
	}
	sort.Strings(names)
	sec := xdswire.Secret{Name: SPIFFERootCA, SPIFFE: []xdswire.TrustDomain{}}
	var errs []error
	for _, n := range names {
		if _, err := spiffeid.TrustDomainFromString(n); err != nil || len(parseAll(bundles[n])) == 0 {
			errs = append(errs, fmt.Errorf("trust domain %q: a valid name and PEM roots are required", n))
			continue
		}
		sec.SPIFFE = append(sec.SPIFFE, xdswire.TrustDomain{Name: n, Bundle: bundles[n]})
	}
	if len(errs) > 0 {
		return xdswire.Secret{}, errors.Join(errs...)
	}
	return sec, nil
}

// WithAliases returns bundles plus home's roots under each trust domain alias
// (Istio's TRUST_DOMAIN_ALIASES): a peer whose ID names an alias is verified
// against this domain's own roots, so it is accepted as this domain. An alias
// that is also a followed foreign domain keeps the foreign roots: aliasing
// never widens what a foreign domain's roots may vouch for.
func WithAliases(bundles map[string][]byte, home string, aliases []string) map[string][]byte {
	out := make(map[string][]byte, len(bundles)+len(aliases))
	for k, v := range bundles {
		out[k] = v
	}
	for _, a := range aliases {
		if _, ok := out[a]; !ok && a != "" {
			out[a] = bundles[home]
		}
	}
	return out
}
