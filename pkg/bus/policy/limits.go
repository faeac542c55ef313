package policy

import (
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// Defaults of PodLimits.
const (
	// DefaultPodMaxPayload is the largest message a pod sends: an event
	// (events.MaxEventSize; a sign request with its token and CSR is smaller)
	// and its headers.
	DefaultPodMaxPayload = events.MaxEventSize + 8<<10
	// DefaultPodMaxSubs: a pod's three processes subscribe to a handful of
	// subjects each (their commands, trust changes, their inbox).
	DefaultPodMaxSubs = 32
	// DefaultPodUserLifetime caps a pod's bus user whatever its token's lifetime;
	// the client reconnects and is admitted again while its token file holds a
	// valid token.
	DefaultPodUserLifetime = time.Hour
	// DefaultPodUserJitter is the fraction of the lifetime taken off at random,
	// so that users admitted together (a fleet starting) do not expire together.
	DefaultPodUserJitter = 0.1
	// DefaultPodMaxAdmissions bounds the connections admitted per pod within one
	// user lifetime (the callout counts them, Admissions).
	DefaultPodMaxAdmissions = 32
)

// PodLimits bound every bus user the auth callout mints for a pod.
type PodLimits struct {
	// MaxPayload (bytes of one message) and MaxSubs are written into the user JWT.
	// nats-server applies them to users of an operator's accounts; in server
	// configuration mode (meshagent's embedded server, the rendered fleet config)
	// v2.15 ignores a callout user's limits, and the server's max_payload and the
	// streams' MaxMsgSize are what refuse an oversize message (docs/security.md).
	MaxPayload int
	MaxSubs    int
	// Lifetime caps the user's expiry, Jitter (0 to 1) takes up to that fraction
	// of it off at random.
	Lifetime time.Duration
	Jitter   float64
	// MaxAdmissions is how many connections one pod may have admitted within
	// Lifetime; as every user expires within Lifetime, it bounds the connections a
	// pod holds at once (per signer replica answering the callout).
	MaxAdmissions int
}

// DefaultPodLimits are the limits unless configured otherwise.
func DefaultPodLimits() PodLimits {
	return PodLimits{MaxPayload: DefaultPodMaxPayload, MaxSubs: DefaultPodMaxSubs, Lifetime: DefaultPodUserLifetime,
		Jitter: DefaultPodUserJitter, MaxAdmissions: DefaultPodMaxAdmissions}
}

// WithDefaults is l with its zero fields (Jitter aside) set to the defaults.
func (l PodLimits) WithDefaults() PodLimits {
	d := DefaultPodLimits()
	if l.MaxPayload == 0 {
		l.MaxPayload = d.MaxPayload
	}
	if l.MaxSubs == 0 {
		l.MaxSubs = d.MaxSubs
	}
	if l.Lifetime == 0 {
		l.Lifetime, l.Jitter = d.Lifetime, d.Jitter
	}
	if l.MaxAdmissions == 0 {
		l.MaxAdmissions = d.MaxAdmissions
	}
	return l
}

// Validate reports every unusable limit at once.
func (l PodLimits) Validate() error {
	var errs []error
	if l.MaxPayload < 1024 {
		errs = append(errs, fmt.Errorf("pod max payload %d: must be at least 1024 bytes", l.MaxPayload))
	}
	if l.MaxSubs < 1 {
		errs = append(errs, fmt.Errorf("pod max subscriptions %d: must be at least 1", l.MaxSubs))
	}
	if l.Lifetime < 10*time.Second {
		errs = append(errs, fmt.Errorf("pod bus user lifetime %s: must be at least 10s", l.Lifetime))
	}
	if l.Jitter < 0 || l.Jitter >= 1 {
		errs = append(errs, fmt.Errorf("pod bus user jitter %g: must be in [0, 1)", l.Jitter))
	}
	if l.MaxAdmissions < 1 {
		errs = append(errs, fmt.Errorf("pod max admissions %d: must be at least 1", l.MaxAdmissions))
	}
	return errors.Join(errs...)
}

// Expiry is when a user admitted at now with a credential valid until credential
// expires: the credential's expiry or, sooner, now + Lifetime less up to Jitter of
// it (r, in [0, 1), picks how much). Never later than the credential.
func (l PodLimits) Expiry(now, credential time.Time, r float64) time.Time {
	life := l.Lifetime - time.Duration(float64(l.Lifetime)*l.Jitter*min(max(r, 0), 1))
	if capped := now.Add(life); capped.Before(credential) {
		return capped
	}
	return credential
}

// apply writes the limits the user JWT carries.
func (l PodLimits) apply(uc *jwt.UserClaims) {
	uc.Limits.Payload = int64(l.MaxPayload)
	uc.Limits.Subs = int64(l.MaxSubs)
}

// AdmitPodIdentityLimited is AdmitPodIdentity with the user's payload and
// subscription limits set from lim. expires is the user's expiry (lim.Expiry).
func AdmitPodIdentityLimited(issuer nkeys.KeyPair, req *jwt.AuthorizationRequestClaims, pod events.PodRef, sa string, expires time.Time, lim PodLimits) ([]byte, error) {
	p, err := ForPodIdentity(pod, sa)
	if err != nil {
		return nil, err
	}
	return admitWith(issuer, req, pod, p, expires, lim.apply)
}
