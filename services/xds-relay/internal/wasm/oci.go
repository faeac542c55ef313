package wasm

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// wasmLayerType is the raw module's layer in the Wasm artifact form, and
// wasmPluginFile the module's name in a tar.gz layer: the image forms Istio's
// agent reads (pkg/wasm/imagefetcher.go, after solo-io's Wasm image spec).
const wasmLayerType types.MediaType = "application/vnd.module.wasm.content.layer.v1+wasm"

const (
	wasmPluginFile = "plugin.wasm"
	ociPrefix      = "oci://"
)

// image is a Wasm image whose manifest has been read: digest is the hex
// sha256 of the manifest (what a WasmPlugin's sha256 names for an oci:// URL),
// and module reads the module out of its layers.
type image struct {
	digest string
	module func() ([]byte, error)
}

// pullManifest reads the manifest of ref (host/repository[:tag|@digest]) as
// Istio's agent does: anonymously (no pull secret), TLS verified unless
// insecure, and again over plain HTTP when the registry answered HTTPS with
// HTTP. The layers are read only when module is called, so a digest that does
// not match costs no download of the module.
func pullManifest(ctx context.Context, ref string, insecure bool, maxBytes int64) (*image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("could not parse url in image reference: %w", err)
	}
	tr := remote.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true // a pull is a few requests; no idle connection outlives it
	if insecure {
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // only for WASM_INSECURE_REGISTRIES hosts, as Istio
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuth(authn.Anonymous),
		remote.WithTransport(realmGuard{tr})}
	desc, err := remote.Get(r, opts...)
	if err != nil && strings.Contains(err.Error(), "server gave HTTP response") {
		if r, err = name.ParseReference(ref, name.Insecure); err == nil {
			desc, err = remote.Get(r, opts...)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("could not fetch manifest: %w", err)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, fmt.Errorf("could not fetch image: %w", err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("could not digest the manifest: %w", err)
	}
	return &image{digest: d.Hex, module: func() ([]byte, error) { return extract(img, maxBytes) }}, nil
}

// extract finds the module in the image's layers, in Istio's order: a Docker
// manifest's last layer, a tar.gz holding plugin.wasm; an OCI manifest's last
// layer of that kind; else a two-layer OCI artifact with a raw Wasm layer.
func extract(img v1.Image, maxBytes int64) ([]byte, error) {
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("could not retrieve manifest: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("could not fetch layers: %w", err)
	}
	if m.MediaType == types.DockerManifestSchema2 {
		b, err := lastTarGz(layers, types.DockerLayer, maxBytes)
		if err != nil {
			return nil, fmt.Errorf("could not extract Wasm file from the image as Docker container: %w", err)
		}
		return b, nil
	}
	b, errCompat := lastTarGz(layers, types.OCILayer, maxBytes)
	if errCompat == nil {
		return b, nil
	}
	b, errOCI := artifact(layers, maxBytes)
	if errOCI == nil {
		return b, nil
	}
	return nil, fmt.Errorf("the given image is in invalid format as an OCI image: %w", errors.Join(
		fmt.Errorf("could not parse as compat variant: %w", errCompat),
		fmt.Errorf("could not parse as oci variant: %w", errOCI)))
}

func lastTarGz(layers []v1.Layer, want types.MediaType, maxBytes int64) ([]byte, error) {
	if len(layers) == 0 {
		return nil, errors.New("number of layers must be greater than zero")
	}
	l := layers[len(layers)-1]
	mt, err := l.MediaType()
	if err != nil {
		return nil, fmt.Errorf("could not get media type: %w", err)
	}
	if mt != want {
		return nil, fmt.Errorf("invalid media type %s (expect %s)", mt, want)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, fmt.Errorf("could not get layer content: %w", err)
	}
	defer rc.Close()
	zr, err := gzip.NewReader(rc)
	if err != nil {
		return nil, fmt.Errorf("failed to parse layer as tar.gz: %w", err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s not found in the archive", wasmPluginFile)
		}
		if err != nil {
			return nil, err
		}
		if path.Base(h.Name) != wasmPluginFile {
			continue
		}
		return readMax(tr, maxBytes)
	}
}

func artifact(layers []v1.Layer, maxBytes int64) ([]byte, error) {
	if len(layers) != 2 {
		return nil, fmt.Errorf("number of layers must be 2 but got %d", len(layers))
	}
	for _, l := range layers {
		mt, err := l.MediaType()
		if err != nil {
			return nil, fmt.Errorf("could not retrieve the media type: %w", err)
		}
		if mt != wasmLayerType {
			continue
		}
		rc, err := l.Compressed() // the Wasm layer is the raw module, not compressed
		if err != nil {
			return nil, fmt.Errorf("could not get layer content: %w", err)
		}
		defer rc.Close()
		return readMax(rc, maxBytes)
	}
	return nil, fmt.Errorf("could not find the layer of type %s", wasmLayerType)
}

// readMax reads r whole, failing past maxBytes (Istio cuts the read there).
func readMax(r io.Reader, maxBytes int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxBytes+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > maxBytes {
		return nil, fmt.Errorf("module larger than %d bytes (ISTIO_WASM_MAX_BINARY_SIZE_BYTES)", maxBytes)
	}
	return b, nil
}

// realmGuard refuses a registry's 401 whose bearer realm points somewhere a
// registry should not send the agent (another scheme, localhost, private,
// loopback or link-local addresses, cloud metadata), as Istio's agent does:
// the token request would otherwise go there.
type realmGuard struct{ inner http.RoundTripper }

func (g realmGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := g.inner.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		return resp, err
	}
	for _, h := range resp.Header.Values("WWW-Authenticate") {
		if err := checkRealms(h); err != nil {
			_ = resp.Body.Close()
			return nil, fmt.Errorf("rejected unsafe bearer realm: %w", err)
		}
	}
	return resp, nil
}

func checkRealms(h string) error {
	for {
		i := strings.Index(h, `realm="`)
		if i < 0 {
			return nil
		}
		h = h[i+len(`realm="`):]
		j := strings.Index(h, `"`)
		if j < 0 {
			return nil
		}
		if err := checkRealm(h[:j]); err != nil {
			return err
		}
		h = h[j+1:]
	}
}

func checkRealm(realm string) error {
	u, err := url.Parse(realm)
	if err != nil {
		return fmt.Errorf("invalid realm URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("realm scheme %q not allowed", u.Scheme)
	}
	host := u.Hostname()
	switch host {
	case "":
		return errors.New("realm missing host")
	case "metadata.google.internal":
		return errors.New("realm targets cloud metadata service")
	case "localhost":
		return errors.New("realm targets localhost")
	}
	if ip := net.ParseIP(host); ip != nil && (ip.IsPrivate() || ip.IsLoopback() || ip.IsLinkLocalUnicast()) {
		return errors.New("realm targets private/loopback/link-local IP")
	}
	return nil
}

// moduleName is what a module is cached under: the URL, or for an OCI image
// its repository without tag or digest (Istio's moduleNameFromURL), so the
// versions of one image share a directory.
func moduleName(rawURL string) string {
	if ref, ok := strings.CutPrefix(rawURL, ociPrefix); ok {
		if r, err := name.ParseReference(ref); err == nil {
			return ociPrefix + r.Context().Name()
		}
	}
	return rawURL
}

// urlDigest is the hex sha256 an oci:// URL pins with @sha256:..., or "".
func urlDigest(rawURL string) string {
	ref, ok := strings.CutPrefix(rawURL, ociPrefix)
	if !ok {
		return ""
	}
	d, err := name.NewDigest(ref)
	if err != nil {
		return ""
	}
	hex, _ := strings.CutPrefix(d.DigestStr(), "sha256:")
	if hex == d.DigestStr() {
		return ""
	}
	return hex
}
