package wasm

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/clock"
)

// fetcher downloads modules over HTTP(S) as Istio's agent does
// (pkg/wasm/httpfetcher.go): each attempt bounded by a request timeout, retried
// with a doubling wait (from 500 ms) on a transport error or a retryable 5xx, at
// most maxAttempts times, the body cut at maxBytes; a gzip or tar box around the
// module is opened.
type fetcher struct {
	client, insecure *http.Client
	maxAttempts      int
	maxBytes         int64
	clk              clock.Clock
}

func newFetcher(timeout time.Duration, maxAttempts int, maxBytes int64, clk clock.Clock) *fetcher {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // only for WASM_INSECURE_REGISTRIES hosts, as Istio
	return &fetcher{
		client:      &http.Client{Timeout: timeout},
		insecure:    &http.Client{Timeout: timeout, Transport: tr},
		maxAttempts: maxAttempts,
		maxBytes:    maxBytes,
		clk:         clk,
	}
}

// fetch returns the body of url as downloaded (the checksum is of these bytes).
func (f *fetcher) fetch(ctx context.Context, url string, insecure bool) ([]byte, error) {
	c := f.client
	if insecure {
		c = f.insecure
	}
	wait := backoff.Policy{First: 500 * time.Millisecond, Max: 8 * time.Second}.Start()
	var last error
	attempts := 0
	for attempts < f.maxAttempts {
		attempts++
		body, retry, err := f.get(ctx, c, url)
		if err == nil {
			return body, nil
		}
		last = err
		if !retry || attempts == f.maxAttempts || !backoff.Wait(ctx, f.clk, wait.Next()) {
			break
		}
	}
	return nil, fmt.Errorf("wasm module download failed after %d attempts, last error: %w", attempts, last)
}

// get makes one attempt; retry says whether another may succeed.
func (f *fetcher) get(ctx context.Context, c *http.Client, url string) (body []byte, retry bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, false, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, ctx.Err() == nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, retryable(resp.StatusCode), fmt.Errorf("status code %d", resp.StatusCode)
	}
	body, err = io.ReadAll(io.LimitReader(resp.Body, f.maxBytes+1))
	if err != nil {
		return nil, ctx.Err() == nil, err
	}
	if int64(len(body)) > f.maxBytes {
		return nil, false, fmt.Errorf("module larger than %d bytes (ISTIO_WASM_MAX_BINARY_SIZE_BYTES)", f.maxBytes)
	}
	return body, false, nil
}

// retryable is Istio's: a 5xx other than 501, 505 and 511.
func retryable(code int) bool {
	return code >= 500 && code != http.StatusNotImplemented && code != http.StatusHTTPVersionNotSupported &&
		code != http.StatusNetworkAuthenticationRequired
}

var wasmMagic = []byte{0x00, 0x61, 0x73, 0x6d}

// isWasm is Istio's check: at least the 8-byte header, starting "\0asm".
func isWasm(b []byte) bool { return len(b) >= 8 && bytes.Equal(b[:4], wasmMagic) }

// unbox opens gzip and tar (first file) layers around a module until it is a
// module; anything else is returned as downloaded (and then fails isWasm).
func unbox(origin []byte, maxBytes int64) []byte {
	b := origin
	for range 8 { // a box in a box in a box...: a few layers at most
		var err error
		switch {
		case isWasm(b):
			return b
		case len(b) > 2 && b[0] == 0x1f && b[1] == 0x8b:
			b, err = gunzip(b, maxBytes)
		case len(b) > 262 && string(b[257:262]) == "ustar":
			b, err = firstTarFile(b, maxBytes)
		default:
			return origin
		}
		if err != nil {
			return origin
		}
	}
	return origin
}

func gunzip(b []byte, maxBytes int64) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	out, err := io.ReadAll(io.LimitReader(zr, maxBytes+1))
	if err == nil && int64(len(out)) > maxBytes {
		err = errors.New("too large")
	}
	return out, err
}

func firstTarFile(b []byte, maxBytes int64) ([]byte, error) {
	tr := tar.NewReader(bytes.NewReader(b))
	h, err := tr.Next()
	if err != nil {
		return nil, err
	}
	if h.Size > maxBytes {
		return nil, errors.New("too large")
	}
	out := make([]byte, h.Size)
	_, err = io.ReadFull(tr, out)
	return out, err
}
