// Package devtoken is the development token issuer: an ES256 key whose JWKS a
// signer trusts, minting Kubernetes-style service-account tokens — the role the
// Kubernetes API server plays in a cluster. meshctl uses it for `meshctl token`,
// the demo pods of `meshctl up` and compose's kubelet; the signer's tests use it
// (Sign with any Token) to mint good and broken tokens alike.
package devtoken

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/meshagent/meshagent/pkg/atomicfile"
)

// Defaults shared with the signer's dev configuration.
const (
	DefaultIssuer   = "meshagent-dev"
	DefaultAudience = "istio-ca"
	keyFile         = "issuer-key.pem"
	jwksFile        = "jwks.json"
)

// Issuer signs tokens with one ES256 key.
type Issuer struct {
	Name string
	key  *ecdsa.PrivateKey
	kid  string
}

// KeyPath and JWKSPath name the files LoadOrCreate uses in dir.
func KeyPath(dir string) string  { return filepath.Join(dir, keyFile) }
func JWKSPath(dir string) string { return filepath.Join(dir, jwksFile) }

// LoadOrCreate loads the issuer key from dir, or makes one (0600) and writes the
// public JWKS beside it, both atomically (pkg/atomicfile).
func LoadOrCreate(dir string) (*Issuer, error) {
	data, err := os.ReadFile(KeyPath(dir))
	switch {
	case err == nil:
		return fromPEM(data)
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("read issuer key: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("issuer key: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("issuer key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("issuer dir: %w", err)
	}
	if err := atomicfile.Write(KeyPath(dir), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, fmt.Errorf("write issuer key: %w", err)
	}
	iss, err := newIssuer(key)
	if err != nil {
		return nil, err
	}
	jwks, err := iss.JWKS()
	if err != nil {
		return nil, err
	}
	if err := atomicfile.Write(JWKSPath(dir), jwks, 0o644); err != nil {
		return nil, fmt.Errorf("write jwks: %w", err)
	}
	return iss, nil
}

// Load loads an existing issuer from dir.
func Load(dir string) (*Issuer, error) {
	data, err := os.ReadFile(KeyPath(dir))
	if err != nil {
		return nil, fmt.Errorf("read issuer key (is meshctl up running, or -dir right?): %w", err)
	}
	return fromPEM(data)
}

func fromPEM(data []byte) (*Issuer, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "EC PRIVATE KEY" {
		return nil, errors.New("issuer key: no EC PRIVATE KEY block")
	}
	key, err := x509.ParseECPrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("issuer key: %w", err)
	}
	return newIssuer(key)
}

// Generate returns an issuer with a fresh P-256 key, kept in memory only.
func Generate() (*Issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("issuer key: %w", err)
	}
	return newIssuer(key)
}

// Key is the issuer's private key.
func (i *Issuer) Key() crypto.Signer { return i.key }

// KID is the key id tokens carry: the key's JWK thumbprint (SHA-256, base64url).
func (i *Issuer) KID() string { return i.kid }

func newIssuer(key *ecdsa.PrivateKey) (*Issuer, error) {
	tp, err := (&jose.JSONWebKey{Key: &key.PublicKey}).Thumbprint(crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("issuer key thumbprint: %w", err)
	}
	return &Issuer{Name: DefaultIssuer, key: key, kid: base64.RawURLEncoding.EncodeToString(tp)}, nil
}

// KeySet is the public key set a signer verifies tokens with.
func (i *Issuer) KeySet() jose.JSONWebKeySet {
	return jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &i.key.PublicKey, KeyID: i.kid, Algorithm: string(jose.ES256), Use: "sig"}}}
}

// JWKS returns the key set as JSON, as the jwks.json file holds it.
func (i *Issuer) JWKS() ([]byte, error) {
	return json.MarshalIndent(i.KeySet(), "", "  ")
}

// Claims are the Kubernetes service-account token claims meshctl mints.
type Claims struct {
	jwt.Claims
	Kubernetes K8s `json:"kubernetes.io"`
}

// K8s is the "kubernetes.io" claim of a projected service-account token. Pod is set
// when the token is bound to a pod, as the kubelet's projected tokens are.
type K8s struct {
	Namespace      string `json:"namespace"`
	ServiceAccount Ref    `json:"serviceaccount"`
	Pod            *Ref   `json:"pod,omitempty"`
	Node           *Ref   `json:"node,omitempty"`
}

// Ref names a Kubernetes object.
type Ref struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// Mint returns a signed token for ns/sa, valid for ttl from now, bound to no pod.
func (i *Issuer) Mint(ns, sa, audience string, ttl time.Duration, now time.Time) (string, error) {
	return i.MintForPod(ns, sa, "", audience, ttl, now)
}

// MintForPod returns a token for ns/sa bound to pod (none when pod is empty): the
// signer then records certificates for that pod only.
func (i *Issuer) MintForPod(ns, sa, pod, audience string, ttl time.Duration, now time.Time) (string, error) {
	return i.MintForPodOnNode(ns, sa, pod, "", audience, ttl, now)
}

// MintForPodOnNode is MintForPod with the token also bound to the node the pod is
// scheduled on (none when node is empty), as Kubernetes binds it from 1.32: the
// node tier admits a pod only on the node its token names.
func (i *Issuer) MintForPodOnNode(ns, sa, pod, node, audience string, ttl time.Duration, now time.Time) (string, error) {
	if ns == "" || sa == "" {
		return "", errors.New("mint token: namespace and service account are required")
	}
	if ttl <= 0 {
		return "", errors.New("mint token: ttl must be positive")
	}
	if audience == "" {
		audience = DefaultAudience
	}
	return Sign(i.key, i.kid, ServiceAccount(i.Name, audience, ns, sa, now, ttl).ForPod(pod).OnNode(node))
}

// uid is the object's UID: derived from its kind and names, so that it stays the same
// for one object across refreshed tokens (as a real object's UID does) and a token
// minted twice from the same claims is the same token.
func uid(kind string, names ...string) string {
	b := sha256.Sum256([]byte(kind + "/" + strings.Join(names, "/")))
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
