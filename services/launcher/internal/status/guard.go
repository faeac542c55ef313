package status

import (
	"errors"
	"mime"
	"net/http"
	"strings"
)

// The state-changing endpoints (/quitquitquit, /drain) are for the pod's own hooks:
// a preStop exec running curl, a sidecar asking the proxy to leave, an operator
// with kubectl exec. Those send a plain POST with no body (or a JSON one) and none
// of the headers a browser adds. A web page open on the same host must not reach
// them: it can POST a form, or fetch() with a "simple" content type, to any
// loopback port without a CORS preflight, and with DNS rebinding its request even
// looks same-origin. So a request that carries a browser's marks is refused:
//
//   - an Origin header (browsers send it on every POST, same-origin or not; the
//     status port serves no page of its own, so no origin is its own);
//   - a Sec-Fetch-Site header other than "none" (sent by every browser since 2023;
//     "none" is a navigation the user typed, which cannot be a POST);
//   - a CORS-"simple" content type: application/x-www-form-urlencoded,
//     multipart/form-data, text/plain — the only bodies a page can send cross-origin
//     without a preflight, which nothing here answers.
var (
	errBrowserOrigin = errors.New("refused: request carries an Origin header; the status port's POST endpoints are for the pod's own hooks, not web pages")
	errBrowserFetch  = errors.New("refused: request carries Sec-Fetch-Site; the status port's POST endpoints are for the pod's own hooks, not web pages")
	errSimpleBody    = errors.New("refused: a form or text/plain body (what a web page can send cross-origin); send no body, or Content-Type: application/json")
)

// simpleTypes are the request content types a browser sends cross-origin without
// asking first (the Fetch standard's CORS-safelisted Content-Type values).
var simpleTypes = map[string]bool{
	"application/x-www-form-urlencoded": true,
	"multipart/form-data":               true,
	"text/plain":                        true,
}

// refuseBrowser returns why r must not change the pod's state, or nil.
func refuseBrowser(r *http.Request) error {
	if _, ok := r.Header["Origin"]; ok {
		return errBrowserOrigin
	}
	if v := r.Header.Get("Sec-Fetch-Site"); v != "" && !strings.EqualFold(v, "none") {
		return errBrowserFetch
	}
	for _, ct := range r.Header.Values("Content-Type") {
		if strings.TrimSpace(ct) == "" {
			continue
		}
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil {
			// A browser's parser is lenient: "text/plain; x" or worse still counts
			// as text/plain there, so an unparsable type is refused too.
			return errSimpleBody
		}
		if simpleTypes[strings.ToLower(mt)] {
			return errSimpleBody
		}
	}
	return nil
}
