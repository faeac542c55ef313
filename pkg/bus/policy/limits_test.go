package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

func TestPodUserExpiry(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l := policy.PodLimits{Lifetime: time.Hour, Jitter: 0.1}
	tests := []struct {
		name       string
		credential time.Time
		r          float64
		want       time.Time
	}{
		{"ten-year token: the cap", now.Add(10 * 365 * 24 * time.Hour), 0, now.Add(time.Hour)},
		{"ten-year token, most jitter: 10% sooner", now.Add(10 * 365 * 24 * time.Hour), 0.999999, now.Add(54 * time.Minute)},
		{"short token: its own expiry", now.Add(10 * time.Minute), 0.5, now.Add(10 * time.Minute)},
		{"r out of range is clamped", now.Add(48 * time.Hour), 7, now.Add(54 * time.Minute)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := l.Expiry(now, tc.credential, tc.r)
			if got.After(tc.credential) {
				t.Fatalf("expiry %s after the credential's %s", got, tc.credential)
			}
			if d := got.Sub(tc.want); d < -time.Second || d > time.Second {
				t.Fatalf("expiry %s, want %s", got, tc.want)
			}
		})
	}
	// Users minted together spread over the jitter.
	seen := map[int64]bool{}
	for i := range 100 {
		seen[l.Expiry(now, now.Add(24*time.Hour), float64(i)/100).Unix()/60] = true
	}
	if len(seen) < 6 {
		t.Fatalf("expiries fall in %d minutes, want them spread over 6", len(seen))
	}
}

func TestPodLimitsValidateAndDefaults(t *testing.T) {
	if err := policy.DefaultPodLimits().Validate(); err != nil {
		t.Fatal(err)
	}
	if got := (policy.PodLimits{}).WithDefaults(); got != policy.DefaultPodLimits() {
		t.Fatalf("zero limits with defaults = %+v", got)
	}
	err := policy.PodLimits{MaxPayload: 10, MaxSubs: 0, Lifetime: time.Second, Jitter: 1, MaxAdmissions: 0}.Validate()
	for _, want := range []string{"payload", "subscriptions", "lifetime", "jitter", "admissions"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v does not name %s", err, want)
		}
	}
	// The payload bound fits the largest legitimate message: an event and its headers.
	if policy.DefaultPodMaxPayload < events.MaxEventSize+1024 {
		t.Fatalf("default payload %d is smaller than an event", policy.DefaultPodMaxPayload)
	}
}

// The user JWT the callout returns carries the limits and the capped expiry.
func TestAdmittedUserCarriesLimits(t *testing.T) {
	issuer, _ := nkeys.CreateAccount()
	user, _ := nkeys.CreateUser()
	upub, _ := user.PublicKey()
	server, _ := nkeys.CreateServer()
	spub, _ := server.PublicKey()
	req := jwt.NewAuthorizationRequestClaims("server")
	req.UserNkey = upub
	req.Server = jwt.ServerID{ID: spub, Name: "s"}
	lim := policy.DefaultPodLimits()
	exp := time.Now().Add(lim.Lifetime).Truncate(time.Second)
	resp, err := policy.AdmitPodIdentityLimited(issuer, req, events.PodRef{Namespace: "default", Name: "web-1"}, "web", exp, lim)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := jwt.DecodeAuthorizationResponseClaims(string(resp))
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(rc.Jwt)
	if err != nil {
		t.Fatal(err)
	}
	if uc.Limits.Payload != int64(lim.MaxPayload) || uc.Limits.Subs != int64(lim.MaxSubs) || uc.Expires != exp.Unix() {
		t.Fatalf("user limits payload %d subs %d expires %d; want %d %d %d", uc.Limits.Payload, uc.Limits.Subs, uc.Expires, lim.MaxPayload, lim.MaxSubs, exp.Unix())
	}
}
