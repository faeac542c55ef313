package inventory

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
)

// OverdueRatio is the fraction of a certificate's life after which its renewal is
// overdue: sds-edge renews by itself at 0.8 (-safety-ratio) when no renew-due came,
// so a certificate older than that was renewed by nobody.
const OverdueRatio = 0.8

// Warnings says what about c needs an operator's attention at now, given the trust
// bundle t (nil when unknown). A pod that said it stopped needs none.
func (c Cert) Warnings(now time.Time, t *Trust) []string {
	if c.Down {
		return nil
	}
	var w []string
	life := c.NotAfter.Sub(c.NotBefore)
	switch {
	case !now.Before(c.NotAfter):
		w = append(w, "expired")
	case c.Served != "" && !strings.EqualFold(c.Served, c.Serial) && !now.Before(c.ServedUntil):
		// Issued a newer one, but the pod serves the one it last pushed.
		w = append(w, fmt.Sprintf("expired: the pod serves serial %s, expired %s, and has not taken the newer %s",
			c.Served, c.ServedUntil.UTC().Format(time.RFC3339), c.Serial))
	case now.After(c.NotBefore.Add(time.Duration(float64(life) * OverdueRatio))):
		w = append(w, "renewal overdue")
	}
	// A named signer's chain ends at its own root: not in the mesh's bundle by design.
	if c.CertSigner == "" && t != nil && len(t.Roots) > 0 && !slices.ContainsFunc(t.Roots, func(r Root) bool { return r.Fingerprint == c.Root }) {
		w = append(w, "root not in bundle")
	}
	return w
}

// RenewsBy is when c is due for renewal (half its life: the rotator's default
// SECRET_GRACE_PERIOD_RATIO, without jitter).
func (c Cert) RenewsBy() time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) / 2)
}

// Silent reports whether c's holder has stopped answering, and why: its
// certificate expired, or the rotator told it to renew and, with no new
// certificate by its retry deadline (-retry-after, 30 s), had to tell it again. A
// live pod renews when told; a VM or pod that went away without a pod.down (killed,
// its host gone) stays in the inventory until its certificate expires, and must not
// be waited for.
func (c Cert) Silent(now time.Time) (bool, string) {
	switch {
	case c.Down:
		return true, "said it stopped"
	case !now.Before(c.NotAfter):
		return true, "certificate expired"
	case c.LastRenewal == events.RenewRetry && c.RenewSent.After(c.Issued):
		return true, "told to renew again at " + c.RenewSent.UTC().Format(time.TimeOnly) + " with no new certificate"
	}
	return false, ""
}
