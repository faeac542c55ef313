package authn

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/tokentest"

	"github.com/go-jose/go-jose/v4"
	"github.com/meshagent/meshagent/pkg/clock"
)

// fuzzJWTNow is the fixed time of every fuzz iteration, so that a saved crasher replays.
var fuzzJWTNow = time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)

// fuzzJWTIssuer is a token issuer with a fixed P-256 key (derived from a constant,
// not random), so that a token saved in testdata/fuzz verifies again on replay.
func fuzzJWTIssuer(f *testing.F, seed string) *tokentest.Issuer {
	f.Helper()
	d := sha256.Sum256([]byte(seed))
	k, err := ecdsa.ParseRawPrivateKey(elliptic.P256(), d[:])
	if err != nil {
		f.Fatal(err)
	}
	tp, err := (&jose.JSONWebKey{Key: k.Public()}).Thumbprint(crypto.SHA256)
	if err != nil {
		f.Fatal(err)
	}
	return &tokentest.Issuer{Key: k, KID: base64.RawURLEncoding.EncodeToString(tp), Iss: "meshagent-dev"}
}

// fuzzSegment base64url-encodes v as JSON, as a JWS segment.
func fuzzSegment(v any) string {
	b, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(b)
}

// FuzzJWTVerify feeds arbitrary token strings to Verify. Seeds: valid ES256 tokens
// minted in the test (with and without a pod claim, kid and kubernetes.io claims),
// signed-but-invalid ones (expired, wrong audience, bad pod claim), alg none, HS256
// keyed with the public key, a stranger's signature, truncated and huge tokens.
//
// Properties: no panic; every failure wraps ErrUnauthenticated; and a token that
// verifies carries exactly the payload of one of the valid minted tokens (a mutated
// token may only verify when it decodes to the same signed bytes: base64 that is
// spelled differently) and yields that token's identity and pod.
func FuzzJWTVerify(f *testing.F) {
	iss := fuzzJWTIssuer(f, "meshagent fuzz issuer")
	stranger := fuzzJWTIssuer(f, "meshagent fuzz stranger")
	v := &JWTVerifier{Keys: StaticKeySet(iss.JWKS()), Issuer: "meshagent-dev", Audience: "istio-ca", TrustDomain: "cluster.local",
		Clock: clock.NewFake(fuzzJWTNow)}

	sa := iss.ServiceAccount("shop", "web", fuzzJWTNow.Add(-time.Minute), time.Hour)
	with := func(f func(*tokentest.Claims)) tokentest.Claims { c := sa; f(&c); return c }
	// valid maps the payload of every token that must verify to its caller.
	valid := map[string]Caller{}
	var validTokens []string
	mintValid := func(c tokentest.Claims, kid, wantID, wantPod string) {
		tok := tokentest.MintWith(f, iss.Key, kid, c)
		got, err := v.Verify(tok)
		if err != nil || got.ID.String() != wantID || got.Pod.Name != wantPod || got.Source != SourceJWT {
			f.Fatalf("seed token for %s pod %q: caller %v %q, %v", wantID, wantPod, got.ID, got.Pod, err)
		}
		payload, _ := base64.RawURLEncoding.DecodeString(strings.Split(tok, ".")[1])
		valid[string(payload)] = got
		validTokens = append(validTokens, tok)
		f.Add(tok)
	}
	mintValid(sa, iss.KID, "spiffe://cluster.local/ns/shop/sa/web", "")
	mintValid(sa.ForPod("web-0"), iss.KID, "spiffe://cluster.local/ns/shop/sa/web", "web-0")
	mintValid(with(func(c *tokentest.Claims) { c.NS, c.SA, c.Sub = "", "", "system:serviceaccount:shop:api" }), iss.KID,
		"spiffe://cluster.local/ns/shop/sa/api", "")
	mintValid(with(func(c *tokentest.Claims) { c.Sub = "system:serviceaccount:kube-system:admin" }), "",
		"spiffe://cluster.local/ns/shop/sa/web", "")

	// Signed by the right key, but refused for what they say.
	for _, c := range []tokentest.Claims{
		iss.ServiceAccount("shop", "web", fuzzJWTNow.Add(-2*time.Hour), time.Hour),
		with(func(c *tokentest.Claims) { c.Aud = []string{"vault"} }),
		with(func(c *tokentest.Claims) { c.Iss = "https://evil" }),
		with(func(c *tokentest.Claims) { c.Exp = time.Time{} }),
		with(func(c *tokentest.Claims) { c.PodClaim = true }),
		with(func(c *tokentest.Claims) { c.Pod = "../web" }),
		with(func(c *tokentest.Claims) { c.NS, c.SA, c.Sub = "", "", "alice" }),
		with(func(c *tokentest.Claims) { c.NS = "Shop/../x" }),
	} {
		f.Add(iss.Mint(f, c))
	}
	good := validTokens[0]
	parts := strings.Split(good, ".")
	// The algorithms Verify must never accept, over a payload that would verify.
	none := fuzzSegment(map[string]string{"alg": "none", "typ": "JWT", "kid": iss.KID}) + "." + parts[1] + "."
	hsHeader := fuzzSegment(map[string]string{"alg": "HS256", "typ": "JWT", "kid": iss.KID})
	jwk, _ := json.Marshal(iss.JWKS().Keys[0])
	mac := hmac.New(sha256.New, jwk)
	mac.Write([]byte(hsHeader + "." + parts[1]))
	hs256 := hsHeader + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
	for _, s := range []string{
		none,
		hs256,
		tokentest.MintWith(f, stranger.Key, iss.KID, sa),
		stranger.Mint(f, sa),
		parts[0] + "." + parts[1],
		good[:len(good)-5],
		good + "." + parts[2],
		parts[0] + "." + fuzzSegment(map[string]any{"iss": "meshagent-dev", "sub": "system:serviceaccount:kube-system:admin", "aud": "istio-ca", "exp": fuzzJWTNow.Add(time.Hour).Unix()}) + "." + parts[2],
		`{"payload":"` + parts[1] + `","protected":"` + parts[0] + `","signature":"` + parts[2] + `"}`,
		"",
		"..",
		"not.a.jwt",
		"eyJ" + strings.Repeat("A", 64<<10) + "." + parts[1] + "." + parts[2],
	} {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, token string) {
		got, err := v.Verify(token)
		if err != nil {
			if !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("error %v does not wrap ErrUnauthenticated", err)
			}
			return
		}
		// It verified: find out what was signed, by the same parser Verify uses.
		jws, err := jose.ParseSignedCompact(token, tokenAlgs)
		if err != nil {
			t.Fatalf("token verified but does not parse: %v", err)
		}
		payload, err := jws.Verify(iss.Key.Public())
		if err != nil {
			t.Fatalf("token verified but its signature is not the issuer's: %v", err)
		}
		want, ok := valid[string(payload)]
		if !ok {
			t.Fatalf("a token whose payload was never signed verified as %v pod %q: %q", got.ID, got.Pod, payload)
		}
		if got.ID.String() != want.ID.String() || got.Pod != want.Pod || got.Source != SourceJWT {
			t.Fatalf("mutated token verified as %v pod %q, the signed token is %v pod %q", got.ID, got.Pod, want.ID, want.Pod)
		}
		if alg := jws.Signatures[0].Header.Algorithm; alg != string(jose.ES256) {
			t.Fatalf("token verified with alg %q; the issuer's key is ES256", alg)
		}
	})
}
