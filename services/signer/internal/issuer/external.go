package issuer

import (
	"context"
	"crypto/x509"
	"errors"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/signer/internal/kubecsr"
)

// MinExternalTTL is the shortest certificate the Kubernetes CSR API lets a
// request ask for (spec.expirationSeconds >= 600).
const MinExternalTTL = 10 * time.Minute

// signExternal is the sign stage of a registration authority: the external
// signer certifies the CSR (Config.External), for the caller authenticated
// above, and r.signing becomes the material of its chain. A refusal, a timeout
// or a certificate that is not what was asked leaves nothing signed here and
// nothing recorded.
func (i *Issuer) signExternal(ctx context.Context, r *request) (*x509.Certificate, error) {
	t, id := r.via.Transport, r.caller.ID
	if r.ttl < MinExternalTTL {
		return nil, i.reject(r, "ttl", errf(events.CodeInvalidArgument, "requested TTL %s is shorter than the external signer's shortest, %s (the Kubernetes CSR API's spec.expirationSeconds)", r.ttl, MinExternalTTL))
	}
	leaf, above, err := i.cfg.External.Sign(ctx, r.csr, id, r.ttl)
	if err != nil {
		i.metrics.SignFail.WithLabelValues(t).Inc()
		i.log.Warn("external signer gave no certificate", "spiffe_id", id.String(), "transport", t, "error", err)
		switch {
		case errors.Is(err, kubecsr.ErrBadCSR):
			return nil, i.reject(r, "csr", errf(events.CodeInvalidArgument, "%v", err))
		case errors.Is(err, kubecsr.ErrRefused):
			return nil, errf(events.CodePermissionDenied, "%v", err)
		case errors.Is(err, kubecsr.ErrTimeout), errors.Is(err, kubecsr.ErrAPI), ctx.Err() != nil:
			return nil, errf(events.CodeUnavailable, "%v", err)
		default:
			return nil, errf(events.CodeInternal, "external signer: %v", err)
		}
	}
	if r.req.Expired(i.now()) {
		// Signed out there after its requester stopped waiting: not recorded, not sent.
		return nil, i.expired(r)
	}
	r.signing = above
	return leaf, nil
}
