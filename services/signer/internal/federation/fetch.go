package federation

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// DefaultMaxBundleSize bounds a fetched bundle or a bundle file unless the
// configuration says otherwise: a bundle of a hundred roots is some 150 KiB.
const DefaultMaxBundleSize = 1 << 20

// maxHeaderBytes bounds the response headers of a bundle endpoint.
const maxHeaderBytes = 64 << 10

// Reasons a refresh fails, as Status.ErrReason and the refresh_errors_total
// metric's reason label: a small fixed set, so that the label stays bounded.
const (
	ReasonTooLarge   = "too_large"   // the bundle is over the size limit
	ReasonRedirect   = "redirect"    // the endpoint answered with a redirect
	ReasonHTTPStatus = "http_status" // the endpoint answered another status than 200
	ReasonConnect    = "connect"     // no connection, TLS or authentication failed, timeout
	ReasonParse      = "parse"       // not a SPIFFE bundle of the domain
	ReasonNoRoots    = "no_roots"    // a bundle without X.509 authorities
	ReasonFile       = "file"        // a bundle file (or bootstrap bundle) could not be read
	ReasonAnnounce   = "announce"    // fetched but not announced to the fleet
)

// FetchError is a failed refresh with its reason.
type FetchError struct {
	Reason string
	Err    error
}

func (e *FetchError) Error() string { return e.Err.Error() }
func (e *FetchError) Unwrap() error { return e.Err }

// Reason is err's reason (ReasonConnect for an error of no known kind).
func Reason(err error) string {
	var fe *FetchError
	if errors.As(err, &fe) {
		return fe.Reason
	}
	return ReasonConnect
}

func fetchErr(reason string, format string, args ...any) error {
	return &FetchError{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// errRedirect is what the client's CheckRedirect returns: no redirect is
// followed, whatever its target. A bundle endpoint is a URL the operator
// configured; a redirect would let the far end (or whoever holds its DNS name)
// send this signer to any address it can reach, at every refresh.
var errRedirect = errors.New("redirect refused: a bundle endpoint must answer at its configured URL")

// fetchURL GETs s's bundle over HTTPS with tlsConf, following no redirect and
// reading at most limit bytes of the body: a larger bundle is refused, not cut.
func fetchURL(ctx context.Context, td spiffeid.TrustDomain, url string, tlsConf *tls.Config, limit int64) (*spiffebundle.Bundle, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsConf
	tr.DisableKeepAlives = true // one request per refresh, minutes apart
	tr.MaxResponseHeaderBytes = maxHeaderBytes
	client := &http.Client{Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return errRedirect }}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	if err != nil {
		return nil, fetchErr(ReasonConnect, "bundle request: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		if errors.Is(err, errRedirect) {
			loc := ""
			if resp != nil {
				loc = resp.Header.Get("Location")
				resp.Body.Close()
			}
			return nil, fetchErr(ReasonRedirect, "GET %s: %w (it pointed to %q)", url, errRedirect, loc)
		}
		return nil, fetchErr(ReasonConnect, "GET bundle: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fetchErr(ReasonHTTPStatus, "GET %s: HTTP status %s", url, resp.Status)
	}
	if resp.ContentLength > limit {
		return nil, tooLarge(url, limit, fmt.Sprintf("Content-Length %d", resp.ContentLength))
	}
	data, err := readLimited(resp.Body, limit)
	if err != nil {
		if errors.Is(err, errOverLimit) {
			return nil, tooLarge(url, limit, "")
		}
		return nil, fetchErr(ReasonConnect, "read bundle: %w", err)
	}
	return parseBundle(td, data)
}

// loadFile reads a bundle file of td, at most limit bytes: the same bound as a
// fetched bundle (a file can be a FIFO, /dev/zero or still growing).
func loadFile(td spiffeid.TrustDomain, path string, limit int64) (*spiffebundle.Bundle, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fetchErr(ReasonFile, "bundle file: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() > limit {
		return nil, tooLarge(path, limit, fmt.Sprintf("%d bytes", fi.Size()))
	}
	data, err := readLimited(f, limit)
	if err != nil {
		if errors.Is(err, errOverLimit) {
			return nil, tooLarge(path, limit, "")
		}
		return nil, fetchErr(ReasonFile, "bundle file: %w", err)
	}
	return parseBundle(td, data)
}

var errOverLimit = errors.New("over the size limit")

// readLimited reads r to its end, or fails with errOverLimit once more than
// limit bytes came: memory never holds more than limit+1 bytes of it.
func readLimited(r io.Reader, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, errOverLimit
	}
	return data, nil
}

func tooLarge(where string, limit int64, seen string) error {
	if seen != "" {
		seen = " (" + seen + ")"
	}
	return fetchErr(ReasonTooLarge, "bundle from %s refused: larger than %d bytes%s (-spiffe-bundle-max-size)", where, limit, seen)
}

func parseBundle(td spiffeid.TrustDomain, data []byte) (*spiffebundle.Bundle, error) {
	b, err := spiffebundle.Parse(td, data)
	if err != nil {
		return nil, fetchErr(ReasonParse, "bundle of %s: %w", td, err)
	}
	if len(b.X509Authorities()) == 0 {
		return nil, fetchErr(ReasonNoRoots, "bundle of %s has no X.509 authorities", td)
	}
	return b, nil
}
