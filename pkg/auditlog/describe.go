package auditlog

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
)

// Line renders an entry as one line for a person watching the stack: time, type, what.
// History is printed as it was: durations in it ("expires in") are relative to the
// event's own time, now only standing in for an event that carries none.
func (e Entry) Line(now time.Time) string {
	t := e.Meta.Time
	if t.IsZero() {
		t = now
	}
	if errors.Is(e.Err, ErrPodMismatch) {
		return fmt.Sprintf("%s  %-22s dropped: published on %s, %v", t.Local().Format("15:04:05"), ShortType(e.Meta.Type), e.Subject, e.Err)
	}
	if e.Err != nil {
		return fmt.Sprintf("%s  (undecodable event on %s: %v)", t.Local().Format("15:04:05"), e.Subject, e.Err)
	}
	return fmt.Sprintf("%s  %-22s %s", t.Local().Format("15:04:05"), ShortType(e.Meta.Type), Describe(e.Payload, t))
}

// Describe says what an event is about in a few words, durations relative to at
// (the event's time, for history).
func Describe(p events.Payload, at time.Time) string {
	var what string
	switch e := p.(type) {
	case events.CertIssued:
		what = fmt.Sprintf("%-8s %s serial=%s expires in %s (by %s over %s, %s)", orDash(e.Pod.String()), e.SPIFFEID, short8(e.Serial),
			e.NotAfter.Sub(at).Round(time.Second), e.Signer, orDash(e.Transport), e.AuthSource)
	case events.TrustChanged:
		what = fmt.Sprintf("%d root(s) in bundle, generation %d, reason %s", len(e.Roots), e.Generation, e.Reason)
	case events.TrustFederated:
		if e.Removed {
			what = fmt.Sprintf("%s no longer trusts %s", e.TrustDomain, e.Foreign)
		} else {
			what = fmt.Sprintf("%s trusts %s: %d root(s) from %s, sequence %d, refresh in %s", e.TrustDomain, e.Foreign, len(e.Roots),
				orDash(e.Source), e.Sequence, e.RefreshHint)
		}
	case events.RenewDue:
		// A forced renewal (meshctl rotate pod) names no certificate: no expiry to show.
		expires := "current cert"
		if !e.NotAfter.IsZero() {
			expires = "cert expires in " + e.NotAfter.Sub(at).Round(time.Second).String()
		}
		what = fmt.Sprintf("%-8s renew %s (%s, attempt %d, %s)", e.Pod, orDefault(e.Resource), e.Reason, e.Attempt, expires)
	case events.SecretPushed:
		what = fmt.Sprintf("%-8s %s %s version=%s serial=%s to %d stream(s)", e.Pod, e.Kind, e.Resource, e.Version, short8(e.Serial), e.Streams)
	case events.SDSNack:
		what = fmt.Sprintf("%-8s NACK %s nonce=%s: %s", e.Pod, e.Resource, e.Nonce, e.Error)
	case events.PodUp:
		what = fmt.Sprintf("%-8s up (%s) %s", e.Pod, e.Mode, e.SPIFFEID)
	case events.PodDown:
		what = fmt.Sprintf("%-8s down: %s", e.Pod, e.Reason)
	case events.XDSConnected:
		what = fmt.Sprintf("%-8s ads %s stream %s -> %s", e.Pod, e.Mode, e.Stream, e.Upstream)
	case events.XDSDisconnected:
		what = fmt.Sprintf("%-8s ads stream %s closed: %s", e.Pod, e.Stream, e.Reason)
	case events.XDSAcked:
		what = fmt.Sprintf("%-8s ACK %s version=%s (stream %s)", e.Pod, e.TypeURL, orDash(e.Version), e.Stream)
	case events.XDSNack:
		what = fmt.Sprintf("%-8s NACK %s nonce=%s: %s", e.Pod, e.TypeURL, e.Nonce, e.ErrorDetail)
	case events.EnvoyStarted:
		what = fmt.Sprintf("%-8s envoy started pid=%d %s", e.Pod, e.PID, orDash(e.Version))
	case events.EnvoyReady:
		what = fmt.Sprintf("%-8s envoy ready pid=%d after %dms", e.Pod, e.PID, e.StartupMillis)
	case events.EnvoyDraining:
		what = fmt.Sprintf("%-8s envoy draining pid=%d (%s, deadline %dms, %s)", e.Pod, e.PID, e.Strategy, e.DeadlineMillis, orDash(e.Reason))
	case events.EnvoyExited:
		what = fmt.Sprintf("%-8s envoy exited pid=%d code=%d signal=%s crashed=%t drain=%s active=%d", e.Pod, e.PID, e.Code,
			orDash(e.Signal), e.Crashed, e.Drain, e.ActiveConnections)
	case events.PodParts:
		if e.Healthy {
			what = fmt.Sprintf("%-8s pod parts serving again", e.Pod)
		} else {
			what = fmt.Sprintf("%-8s pod parts down: %s", e.Pod, strings.Join(e.Missing, "; "))
		}
	default:
		what = fmt.Sprintf("%+v", p)
	}
	return what
}

func short8(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	if s == "" {
		return "-"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func orDefault(s string) string {
	if s == "" {
		return "default"
	}
	return s
}
