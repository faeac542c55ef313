package policy_test

import (
	"encoding/base64"
	"encoding/json"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// serverRequest is a connect request as nats-server makes one: issued and signed by
// the server's key, for a user nkey, with the client's token.
func serverRequest(t testing.TB) (string, *jwt.AuthorizationRequestClaims) {
	t.Helper()
	server, _ := nkeys.CreateServer()
	spub, _ := server.PublicKey()
	user, _ := nkeys.CreateUser()
	upub, _ := user.PublicKey()
	req := jwt.NewAuthorizationRequestClaims(spub)
	req.Server = jwt.ServerID{ID: spub, Name: "nats-0", Host: "127.0.0.1"}
	req.UserNkey = upub
	req.ConnectOptions = jwt.ConnectOptions{Token: strings.Repeat("t", 800), Username: "default/web-1", Name: "sds-edge"}
	req.ClientInformation = jwt.ClientInformation{Host: "10.0.0.7", ID: 42, Kind: "Client", Type: "nats"}
	req.Expires = time.Now().Add(2 * time.Second).Unix()
	token, err := req.Encode(server)
	if err != nil {
		t.Fatal(err)
	}
	return token, req
}

// The request decodes to exactly what nats' own (verifying) decoder makes of it.
func TestAuthRequestDecodedAsJWTDecodesIt(t *testing.T) {
	token, sent := serverRequest(t)
	got, err := policy.DecodeAuthRequest([]byte(token))
	if err != nil {
		t.Fatal(err)
	}
	want, err := jwt.DecodeAuthorizationRequestClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%+v\nnats' decoder\n%+v", got, want)
	}
	if got.ConnectOptions.Token != strings.Repeat("t", 800) || got.Expires != sent.Expires || got.IssuedAt == 0 {
		t.Fatalf("token %d bytes, issued %d expires %d (sent %d)", len(got.ConnectOptions.Token), got.IssuedAt, got.Expires, sent.Expires)
	}
}

// Anything but a server's authorization request for a user is refused with an
// error that says what it is.
func TestMalformedAuthRequestsRefused(t *testing.T) {
	token, req := serverRequest(t)
	chunks := strings.Split(token, ".")
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	with := func(edit func(c *jwt.AuthorizationRequestClaims)) string {
		c := *req
		edit(&c)
		return chunks[0] + "." + enc(c) + "." + chunks[2]
	}
	account, _ := nkeys.CreateAccount()
	apub, _ := account.PublicKey()
	user, _ := nkeys.CreateUser()
	upub, _ := user.PublicKey()
	userJWT, err := jwt.NewUserClaims(upub).Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, data, says string }{
		{"empty", "", "3 chunks"},
		{"two chunks", chunks[0] + "." + chunks[1], "3 chunks"},
		{"not base64", chunks[0] + ".!!!." + chunks[2], "claims"},
		{"not JSON", chunks[0] + "." + base64.RawURLEncoding.EncodeToString([]byte("{")) + "." + chunks[2], "claims"},
		{"another algorithm", enc(jwt.Header{Type: "JWT", Algorithm: "HS256"}) + "." + chunks[1] + "." + chunks[2], "algorithm"},
		{"a user JWT", userJWT, "not an authorization request"},
		{"issued by an account", with(func(c *jwt.AuthorizationRequestClaims) { c.Issuer = apub; c.Server.ID = apub }), "not a server's request"},
		{"issued by another server", with(func(c *jwt.AuthorizationRequestClaims) { c.Server.ID = "NBADSERVER" }), "not a server's request"},
		{"no user nkey", with(func(c *jwt.AuthorizationRequestClaims) { c.UserNkey = "" }), "no user nkey"},
		{"an account as the user", with(func(c *jwt.AuthorizationRequestClaims) { c.UserNkey = apub }), "no user nkey"},
		{"too large", strings.Repeat("a", jwt.MaxTokenSize+1), "more than a JWT"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := policy.DecodeAuthRequest([]byte(tc.data))
			if err == nil {
				t.Fatalf("decoded: %+v", got)
			}
			if !strings.Contains(err.Error(), tc.says) || !strings.HasPrefix(err.Error(), "decode auth request: ") {
				t.Fatalf("error %q does not say %q", err, tc.says)
			}
		})
	}
}

// BenchmarkDecodeAuthRequest: the callout's decode beside nats' decoder, which
// also checks the request's self-signed signature (DecodeAuthRequest says why the
// callout does not).
func BenchmarkDecodeAuthRequest(b *testing.B) {
	token, _ := serverRequest(b)
	b.Run("callout", func(b *testing.B) {
		for b.Loop() {
			if _, err := policy.DecodeAuthRequest([]byte(token)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("jwt-verifying", func(b *testing.B) {
		for b.Loop() {
			if _, err := jwt.DecodeAuthorizationRequestClaims(token); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestOnlyTheServerRequestsAdmission: DecodeAuthRequest leaves the request's
// self-signed signature unchecked because no one but nats-server can publish where
// the callout listens. Every role's user and an admitted pod try to, with a request
// signed by a server key of their own and with bytes that are no request; the
// callout's subscription receives only the server's requests for real connects.
func TestOnlyTheServerRequestsAdmission(t *testing.T) {
	m := newMesh(t)
	listener := m.Conn(t, policy.Callout, nil)
	var forged, real atomic.Int64
	if _, err := listener.Subscribe(policy.AuthCalloutSubject, func(msg *nats.Msg) {
		req, err := policy.DecodeAuthRequest(msg.Data)
		if err != nil || req.ConnectOptions.Name == "forged" {
			forged.Add(1)
			return
		}
		real.Add(1)
	}); err != nil {
		t.Fatal(err)
	}
	flushed(t, listener)

	_, forgedClaims := serverRequest(t)
	forgedClaims.ConnectOptions.Name = "forged"
	kp, _ := nkeys.CreateServer()
	kpub, _ := kp.PublicKey()
	forgedClaims.Server.ID = kpub
	forgedClaims.Issuer = kpub
	signed, err := forgedClaims.Encode(kp)
	if err != nil {
		t.Fatal(err)
	}
	senders := []*nats.Conn{m.pod(t, "pod-a", nil), listener}
	for _, r := range policy.Users {
		senders = append(senders, m.Conn(t, r, nil))
	}
	for _, nc := range senders {
		for _, data := range []string{signed, "forged"} {
			_ = nc.Publish(policy.AuthCalloutSubject, []byte(data))
			_, _ = nc.Request(policy.AuthCalloutSubject, []byte(data), 50*time.Millisecond)
		}
	}
	flushed(t, senders...)
	// A real connect after the forgeries: once its request has arrived, so would
	// anything published before it.
	before := real.Load()
	m.pod(t, "pod-b", nil)
	testkit.EventuallyWithin(t, 5*time.Second, "the callout's subscription receives a real connect's request", func() bool { return real.Load() > before })
	flushed(t, listener)
	if n := forged.Load(); n != 0 {
		t.Fatalf("%d forged requests reached the callout", n)
	}
}
