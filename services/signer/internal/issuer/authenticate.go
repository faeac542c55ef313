package issuer

import (
	"crypto/x509"
	"encoding/base64"
	"fmt"

	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
)

// authenticate is who the request's one credential says asks: the identity its
// bus subject proves, else its bearer token's, else its mTLS peer's, else its
// certificate chain's with the proof that the caller holds the chain's key.
func (i *Issuer) authenticate(req events.SignRequest, via Via, csr *x509.CertificateRequest, mat *ca.Material) (authn.Caller, error) {
	peer := via.PeerChain
	switch {
	case via.BusID != nil:
		return authn.Caller{ID: via.BusID, Source: SourceBus, Pod: via.BusPod}, nil
	case req.Token != "":
		if i.tokens == nil {
			return authn.Caller{}, fmt.Errorf("%w: bearer tokens are not accepted: no JWKS or TokenReview configured", authn.ErrUnauthenticated)
		}
		i.metrics.TokensVerified.WithLabelValues(via.Transport).Inc()
		return i.tokens.Verify(req.Token)
	case len(peer) > 0:
		return authn.VerifyCert(peer, mat.Roots, i.cfg.TrustDomain, x509.VerifyOptions{CurrentTime: i.now()})
	case len(req.CertChain) > 0:
		chain, err := pki.ParseCertPEMs(req.CertChain)
		if err != nil {
			return authn.Caller{}, fmt.Errorf("%w: cert_chain: %v", authn.ErrUnauthenticated, err)
		}
		caller, err := authn.VerifyCert(chain, mat.Roots, i.cfg.TrustDomain, x509.VerifyOptions{CurrentTime: i.now()})
		if err != nil {
			return caller, err
		}
		sig, err := base64.StdEncoding.DecodeString(req.Proof)
		if err != nil {
			return authn.Caller{}, fmt.Errorf("%w: proof is not base64: %v", authn.ErrUnauthenticated, err)
		}
		if err := pki.VerifyProof(chain[0].PublicKey, csr.Raw, sig); err != nil {
			return authn.Caller{}, fmt.Errorf("%w: %v", authn.ErrUnauthenticated, err)
		}
		return caller, nil
	}
	return authn.Caller{}, fmt.Errorf("%w: no credential: send a bearer token or a client certificate", authn.ErrUnauthenticated)
}

// provePod returns the pod a certificate is recorded for: the one the bus subject
// proves, else the one a pod-bound token proves, else none. A pod named by the
// request, or by the token, that disagrees with what is proved is refused.
//
// A pod is namespace + name, and a pod is only ever in its identity's namespace: a
// proved pod of another namespace than the certificate's SPIFFE ID is refused, so
// that no certificate is recorded for (and no schedule entry replaced of) a pod of
// another namespace.
func provePod(reqPod, busPod events.PodRef, caller authn.Caller) (events.PodRef, *Error) {
	var none events.PodRef
	proved := busPod
	if !caller.Pod.IsZero() {
		if !proved.IsZero() && proved != caller.Pod {
			return none, errf(events.CodePermissionDenied, "request came on pod %q's subject but the token was issued for pod %q", proved, caller.Pod)
		}
		proved = caller.Pod
	}
	if !reqPod.IsZero() && reqPod != proved {
		if proved.IsZero() {
			return none, errf(events.CodePermissionDenied, "request names pod %q, which neither its bus subject nor its token proves", reqPod)
		}
		return none, errf(events.CodePermissionDenied, "request names pod %q but its credentials prove pod %q", reqPod, proved)
	}
	if !proved.IsZero() {
		if _, ns, _, err := pki.ParseWorkloadID(caller.ID.String()); err != nil || ns != proved.Namespace {
			return none, errf(events.CodePermissionDenied, "pod %q is not in the namespace of identity %s", proved, caller.ID)
		}
	}
	return proved, nil
}

// proveNode checks a request that came through a node's tier (busNode not ""):
// its credential must be the pod's token, bound to pod and to that node. A node
// can thus get certificates only for the pods scheduled on it, even holding
// another node's pod's token.
func proveNode(busNode string, pod events.PodRef, caller authn.Caller) *Error {
	switch {
	case busNode == "":
		return nil
	case caller.Source != authn.SourceJWT || pod.IsZero() || caller.Pod != pod:
		return errf(events.CodePermissionDenied, "a request through node %q must carry the pod's own token, bound to the pod", busNode)
	case caller.Node == "":
		return errf(events.CodePermissionDenied, "pod %s's token names no node (kubernetes.io.node.name, Kubernetes 1.32 on): the node tier cannot check that the pod is on node %q", pod, busNode)
	case caller.Node != busNode:
		return errf(events.CodePermissionDenied, "pod %s's token binds it to node %q; the request came through node %q", pod, caller.Node, busNode)
	}
	return nil
}
