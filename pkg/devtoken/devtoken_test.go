package devtoken

import (
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

func TestMintVerifiesAgainstWrittenJWKS(t *testing.T) {
	dir := t.TempDir()
	iss, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(KeyPath(dir)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("issuer key mode: %v %v", fi.Mode(), err)
	}
	now := time.Now()
	tok, err := iss.Mint("default", "web", "", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(JWKSPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(raw, &set); err != nil {
		t.Fatal(err)
	}
	parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	keys := set.Key(parsed.Headers[0].KeyID)
	if len(keys) != 1 {
		t.Fatalf("kid %q not in jwks", parsed.Headers[0].KeyID)
	}
	var c Claims
	if err := parsed.Claims(keys[0].Key, &c); err != nil {
		t.Fatal(err)
	}
	if err := c.ValidateWithLeeway(jwt.Expected{Issuer: DefaultIssuer, AnyAudience: jwt.Audience{DefaultAudience}, Time: now}, 0); err != nil {
		t.Fatal(err)
	}
	if c.Kubernetes.Namespace != "default" || c.Kubernetes.ServiceAccount.Name != "web" || c.Subject != "system:serviceaccount:default:web" {
		t.Fatalf("claims %+v", c)
	}
	if c.Kubernetes.Pod != nil {
		t.Fatalf("unbound token names pod %+v", c.Kubernetes.Pod)
	}
	bound, err := iss.MintForPod("default", "web", "web-0", "", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err = jwt.ParseSigned(bound, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	var bc Claims
	if err := parsed.Claims(keys[0].Key, &bc); err != nil {
		t.Fatal(err)
	}
	if bc.Kubernetes.Pod == nil || bc.Kubernetes.Pod.Name != "web-0" || bc.Kubernetes.Pod.UID == "" {
		t.Fatalf("pod claim %+v", bc.Kubernetes.Pod)
	}
	// Loading again gives the same key.
	again, err := LoadOrCreate(dir)
	if err != nil || again.kid != iss.kid {
		t.Fatalf("reload: %v", err)
	}
}

func TestMintRejectsBadInput(t *testing.T) {
	iss, err := LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, ns, sa string
		ttl          time.Duration
	}{
		{"no ns", "", "web", time.Hour}, {"no sa", "default", "", time.Hour}, {"zero ttl", "default", "web", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := iss.Mint(tc.ns, tc.sa, "", tc.ttl, time.Now()); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// TestSignLeavesOutZeroClaims: Sign writes exactly the claims set, so tests can
// mint broken tokens (no expiry, an empty pod object).
func TestSignLeavesOutZeroClaims(t *testing.T) {
	iss, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := Sign(iss.Key(), iss.KID(), Token{Iss: "x", NS: "default", SA: "web", PodClaim: true})
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	if kid := parsed.Headers[0].KeyID; kid != iss.KID() {
		t.Fatalf("kid %q, want %q", kid, iss.KID())
	}
	var m map[string]any
	if err := parsed.Claims(iss.Key().Public(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"sub", "aud", "exp", "iat", "nbf"} {
		if _, ok := m[k]; ok {
			t.Errorf("zero claim %q written: %v", k, m[k])
		}
	}
	k8s, _ := m["kubernetes.io"].(map[string]any)
	pod, ok := k8s["pod"].(map[string]any)
	if !ok || pod["name"] != "" {
		t.Fatalf("PodClaim with no pod: kubernetes.io = %v", k8s)
	}
	sa := ServiceAccount("iss", "", "ns", "sa", time.Unix(100, 0), time.Minute).ForPod("p-0")
	if sa.Aud[0] != DefaultAudience || sa.Sub != "system:serviceaccount:ns:sa" || sa.Pod != "p-0" || !sa.Exp.Equal(time.Unix(160, 0)) {
		t.Fatalf("ServiceAccount = %+v", sa)
	}
}
