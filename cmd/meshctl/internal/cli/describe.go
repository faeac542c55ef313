package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
)

// describe renders one event as a short line for a person watching the stack.
func describe(p events.Payload, meta events.Meta, now time.Time) string {
	short := strings.TrimSuffix(strings.TrimPrefix(meta.Type, "io.meshagent."), ".v1")
	var what string
	switch e := p.(type) {
	case events.CertIssued:
		what = fmt.Sprintf("%-8s %s serial=%s expires in %s (by %s over %s, %s)", orDash(e.Pod), e.SPIFFEID, short8(e.Serial),
			e.NotAfter.Sub(now).Round(time.Second), e.Signer, orDash(e.Transport), e.AuthSource)
	case events.TrustChanged:
		what = fmt.Sprintf("%d root(s) in bundle, generation %d, reason %s", len(e.Roots), e.Generation, e.Reason)
	case events.RenewDue:
		what = fmt.Sprintf("%-8s renew %s (%s, attempt %d, cert expires in %s)", e.Pod, orDefault(e.Resource), e.Reason, e.Attempt,
			e.NotAfter.Sub(now).Round(time.Second))
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
	default:
		what = fmt.Sprintf("%+v", p)
	}
	return fmt.Sprintf("%s  %-22s %s", meta.Time.Local().Format("15:04:05"), short, what)
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
