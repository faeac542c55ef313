package issuer

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"slices"
	"time"

	"github.com/meshagent/meshagent/pkg/authn"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/nats-io/nats.go"
)

// request is one sign request as it goes through prepare's stages, each filling
// in what the next needs.
type request struct {
	req events.SignRequest
	via Via
	// check: the TTL granted (the policy stage may clamp it), the mesh CA's
	// material now, the CSR and its key's algorithm.
	ttl time.Duration
	mat *ca.Material
	csr *x509.CertificateRequest
	alg pki.KeyAlg
	// authenticate: who asks (the impersonated workload, for a node agent).
	caller authn.Caller
	// prove: the pod the certificate is recorded for (none: zero) and its holder,
	// the pod or, for a caller that is no pod, its SPIFFE ID.
	pod    events.PodRef
	holder string
	// policy: when it is signed, the material that signs it and what a repeat of
	// the request is answered with (nil: kept for none).
	now     time.Time
	signing *ca.Material
	key     *answerKey
}

// prepare checks, authenticates and signs req and encodes its writes, stage by
// stage: check, authenticate, prove, policy, sign and record. A stage that
// refuses the request has counted and logged why; nothing after it runs, and
// nothing is signed or written.
func (i *Issuer) prepare(ctx context.Context, req events.SignRequest, via Via) (*issued, error) {
	i.metrics.Received.WithLabelValues(via.Transport).Inc()
	r := &request{req: req, via: via}
	if err := i.check(r); err != nil {
		return nil, err
	}
	if err := i.authenticateCaller(ctx, r); err != nil {
		return nil, err
	}
	if err := i.prove(r); err != nil {
		return nil, err
	}
	if repeat, err := i.policy(ctx, r); repeat != nil || err != nil {
		return repeat, err
	}
	leaf, err := i.sign(ctx, r)
	if err != nil {
		return nil, err
	}
	return i.record(r, leaf)
}

// reject counts and logs a request refused before signing for reason.
func (i *Issuer) reject(r *request, reason string, err *Error) error {
	i.metrics.Rejected.WithLabelValues(r.via.Transport, reason).Inc()
	i.log.Debug("request rejected", "transport", r.via.Transport, "reason", reason, "error", err.Msg)
	return err
}

// expired drops a request whose requester has stopped waiting: before any work
// (a backlog read by a signer that was frozen), and again just before signing.
func (i *Issuer) expired(r *request) error {
	t, req := r.via.Transport, r.req
	i.metrics.Expired.WithLabelValues(t).Inc()
	i.log.Debug("request dropped: its requester stopped waiting", "transport", t, "deadline", req.Deadline, "late", i.now().Sub(req.Deadline))
	return errf(events.CodeDeadlineExceeded, "request expired at %s: its requester stopped waiting", req.Deadline.UTC().Format(time.RFC3339Nano))
}

// check is the first stage: the request is still awaited, within the limits
// (size, signer, TTL, resource, pod), the CA is loaded and the CSR parses.
func (i *Issuer) check(r *request) error {
	req := r.req
	if req.Expired(i.now()) {
		return i.expired(r)
	}
	if len(req.CSR) > events.MaxEventSize {
		return i.reject(r, "too_large", errf(events.CodeResourceExhausted, "csr is %d bytes, limit %d", len(req.CSR), events.MaxEventSize))
	}
	if req.CertSigner != "" && !slices.Contains(i.cfg.Signers, req.CertSigner) {
		return i.reject(r, "unknown_signer", errf(events.CodeInvalidArgument, "unknown cert signer %q", req.CertSigner))
	}
	r.ttl = i.cfg.DefaultTTL
	if req.TTL > 0 {
		r.ttl = req.TTL
	}
	if r.ttl > i.cfg.MaxTTL {
		return i.reject(r, "ttl", errf(events.CodeInvalidArgument, "requested TTL %s is greater than the max allowed TTL %s", r.ttl, i.cfg.MaxTTL))
	}
	// Only the default SDS resource is CA-issued; ROOTCA and others are not certificates.
	if req.Resource != "" && req.Resource != DefaultResource {
		return i.reject(r, "resource", errf(events.CodeInvalidArgument, "resource %q is not signed by the CA: only %q (or empty) is", req.Resource, DefaultResource))
	}
	if !req.Pod.IsZero() {
		if err := req.Pod.Validate(); err != nil {
			return i.reject(r, "pod", errf(events.CodeInvalidArgument, "%v", err))
		}
	}
	if r.mat = i.auth.Current(); r.mat == nil {
		return i.reject(r, "not_ready", errf(events.CodeUnavailable, "CA not loaded yet"))
	}
	return i.checkCSR(r)
}

// checkCSR parses the CSR and checks its key is the algorithm the request says.
func (i *Issuer) checkCSR(r *request) error {
	csr, err := pki.ParseCSR([]byte(r.req.CSR))
	if err != nil {
		i.metrics.ParseFail.WithLabelValues(r.via.Transport).Inc()
		return i.reject(r, "csr", errf(events.CodeInvalidArgument, "%v", err))
	}
	alg, err := pki.AlgOf(csr.PublicKey)
	if err != nil {
		i.metrics.ParseFail.WithLabelValues(r.via.Transport).Inc()
		return i.reject(r, "csr", errf(events.CodeInvalidArgument, "csr key: %v", err))
	}
	if r.req.KeyAlgorithm != "" {
		if said, err := pki.ParseKeyAlg(r.req.KeyAlgorithm); err != nil || said != alg {
			return i.reject(r, "key_algorithm", errf(events.CodeInvalidArgument, "key_algorithm %q does not match the CSR's %s key", r.req.KeyAlgorithm, alg))
		}
	}
	r.csr, r.alg = csr, alg
	return nil
}

// authenticateCaller is the second stage: the request's one credential says who
// asks; a trusted node agent may then ask for a workload on its node.
func (i *Issuer) authenticateCaller(ctx context.Context, r *request) error {
	t, via := r.via.Transport, r.via
	caller, err := i.authenticate(r.req, via, r.csr, r.mat)
	if errors.Is(err, authn.ErrUnavailable) {
		// No verdict on the token (the API server did not answer): the caller retries.
		return i.reject(r, "auth_unavailable", errf(events.CodeUnavailable, "%v", err))
	}
	if err != nil {
		i.metrics.AuthFailures.WithLabelValues(t).Inc()
		return i.reject(r, "auth", errf(events.CodeUnauthenticated, "%v", err))
	}
	r.caller = caller
	if via.Impersonate == "" {
		return nil
	}
	if i.cfg.Nodes == nil {
		return i.reject(r, "impersonation", errf(events.CodePermissionDenied, "%s may not impersonate %q: no node agent is trusted to (CA_TRUSTED_NODE_ACCOUNTS is empty)", caller.ID, via.Impersonate))
	}
	target, err := i.cfg.Nodes.Authorize(ctx, caller, via.Impersonate)
	if errors.Is(err, authn.ErrUnavailable) {
		return i.reject(r, "auth_unavailable", errf(events.CodeUnavailable, "%v", err))
	}
	if err != nil {
		i.log.Warn("impersonation refused", "transport", t, "spiffe_id", caller.ID.String(), "impersonate", via.Impersonate, "error", err)
		return i.reject(r, "impersonation", errf(events.CodePermissionDenied, "%v", err))
	}
	i.log.Info("impersonation", "transport", t, "node_agent", caller.ID.String(), "spiffe_id", target.ID.String())
	r.caller = target
	return nil
}

// prove is the third stage: the pod the certificate is recorded for must be
// proved. The rotator keys its schedule on (pod, resource), so a certificate
// recorded for the wrong pod would replace that pod's entry.
func (i *Issuer) prove(r *request) error {
	caller := r.caller
	pod, perr := provePod(r.req.Pod, r.via.BusPod, caller)
	if perr != nil {
		i.log.Warn("pod not proved", "transport", r.via.Transport, "spiffe_id", caller.ID.String(), "request_pod", r.req.Pod, "bus_pod", r.via.BusPod, "token_pod", caller.Pod)
		return i.reject(r, "pod_mismatch", perr)
	}
	if err := proveNode(r.via.BusNode, pod, caller); err != nil {
		i.log.Warn("node not proved", "transport", r.via.Transport, "spiffe_id", caller.ID.String(), "pod", pod, "bus_node", r.via.BusNode, "token_node", caller.Node)
		return i.reject(r, "node_mismatch", err)
	}
	r.pod = pod
	// A pod is its namespace/name; a caller that is no pod, its SPIFFE ID.
	r.holder = caller.ID.String()
	if !pod.IsZero() {
		r.holder = pod.String()
	}
	return nil
}

// policy is the fourth stage, what the issuing policy says of this caller now:
// a pod's TTL is capped; a repeat of a request answered moments ago gets the
// same certificate (returned, with nothing to write); a holder that keeps asking
// is refused; a named signer's material signs; a request that cannot be answered
// before its deadline is dropped. A refusal changes nothing.
func (i *Issuer) policy(ctx context.Context, r *request) (*issued, error) {
	t, caller, req := r.via.Transport, r.caller, r.req
	if (!r.pod.IsZero() || !caller.Pod.IsZero()) && i.cfg.PodMaxTTL > 0 && r.ttl > i.cfg.PodMaxTTL {
		i.metrics.Clamped.WithLabelValues(t).Inc()
		i.log.Info("ttl clamped", "transport", t, "spiffe_id", caller.ID.String(), "pod", cmp.Or(r.pod, caller.Pod), "requested", r.ttl, "granted", i.cfg.PodMaxTTL)
		r.ttl = i.cfg.PodMaxTTL
	}
	r.now = i.now()
	if repeat := i.repeated(r); repeat != nil {
		return repeat, nil
	}
	if ok, n, next := i.again.allow(r.holder, r.now); !ok {
		i.log.Warn("not issuing: the holder keeps asking for certificates", "transport", t, "holder", r.holder, "issued", n, "window", ReissueWindow)
		return nil, i.reject(r, "reissue_limit", errf(events.CodeResourceExhausted,
			"%s was issued %d certificates in the last %s, each before the one before it was a quarter through its life, and keeps asking: it may be refusing them (check that its trust bundle, ROOTCA, accepts the chain); the next is issued after %s",
			r.holder, n, ReissueWindow, next.UTC().Format(time.RFC3339)))
	}
	// A named signer signs with its own chain; the caller was authenticated against
	// the mesh's roots.
	r.signing = r.mat
	if req.CertSigner != "" && i.cfg.Named != nil {
		named, err := i.cfg.Named.Material(req.CertSigner, r.now)
		if err != nil {
			return nil, i.reject(r, "signer_material", errf(events.CodeInvalidArgument, "%v", err))
		}
		r.signing = named
	}
	if req.Expired(i.now()) {
		return nil, i.expired(r)
	}
	if i.finish.tooLate(req.Deadline, i.now()) {
		i.metrics.Expired.WithLabelValues(t).Inc()
		i.log.Debug("request dropped: too little time left to answer it", "transport", t, "deadline", req.Deadline, "left", req.Deadline.Sub(i.now()), "needed", i.finish.margin())
		return nil, errf(events.CodeDeadlineExceeded, "request expires at %s, sooner than its answer could be recorded and sent (%s)", req.Deadline.UTC().Format(time.RFC3339Nano), i.finish.margin())
	}
	return nil, nil
}

// repeated is, for a repeat of a request whose certificate was recorded moments
// ago (its answer was lost), that certificate: nothing is signed, written or
// counted again. Only the mesh CA's certificates are kept (a named signer's
// material is chosen after).
func (i *Issuer) repeated(r *request) *issued {
	if r.req.CertSigner != "" || i.cfg.External != nil {
		return nil
	}
	k := newAnswerKey(r.holder, r.caller.ID.String(), r.req.Resource, r.ttl, r.csr.Raw)
	r.key = &k
	res, ok := i.answers.get(k, r.mat, r.now)
	if !ok {
		return nil
	}
	i.metrics.Repeats.WithLabelValues(r.via.Transport).Inc()
	i.log.Debug("request repeated: answered with the certificate already recorded for it", "transport", r.via.Transport, "holder", r.holder, "serial", pki.SerialHex(res.Leaf))
	return &issued{i: i, signed: r.now, res: res, via: r.via, src: r.caller.Source, repeat: true}
}

// sign is the fifth stage: the mesh CA first records how long the leaf will
// live (its rotation's phases follow it), then the signing material signs it.
func (i *Issuer) sign(ctx context.Context, r *request) (*x509.Certificate, error) {
	t, id := r.via.Transport, r.caller.ID
	if i.cfg.External != nil {
		return i.signExternal(ctx, r)
	}
	if r.signing == r.mat && i.cfg.Lives != nil {
		if err := i.cfg.Lives.NoteLife(ctx, r.ttl+ca.Backdate); err != nil {
			i.metrics.SignFail.WithLabelValues(t).Inc()
			i.log.Error("sign refused: leaf lifetime not recorded", "spiffe_id", id.String(), "error", err)
			return nil, errf(events.CodeUnavailable, "%v", err)
		}
	}
	leaf, err := r.signing.SignLeaf(r.csr.PublicKey, id, r.now, r.ttl)
	if err != nil {
		i.metrics.SignFail.WithLabelValues(t).Inc()
		i.log.Error("sign failed", "spiffe_id", id.String(), "error", err)
		if errors.Is(err, ca.ErrCAExpired) {
			return nil, errf(events.CodeUnavailable, "%v", err)
		}
		return nil, errf(events.CodeInternal, "sign: %v", err)
	}
	return leaf, nil
}

// record is the last stage: the writes that record leaf (for a pod's, its
// record, then cert.issued) and the answer, given once they are stored.
func (i *Issuer) record(r *request, leaf *x509.Certificate) (*issued, error) {
	t, req, now := r.via.Transport, r.req, r.now
	leafPEM := string(pki.EncodeCertPEM(leaf))
	ev := events.CertIssued{
		Serial: pki.SerialHex(leaf), SPIFFEID: r.caller.ID.String(), NotBefore: leaf.NotBefore, NotAfter: leaf.NotAfter,
		Pod: r.pod, Resource: req.Resource, KeyAlgorithm: string(r.alg), AuthSource: r.caller.Source,
		Signer: i.cfg.Instance, Transport: t, RootFingerprint: r.signing.RootFingerprint(),
		CertChain: append([]string{leafPEM}, r.signing.IntermediatePEMs()...),
	}
	if req.CertSigner != "" && r.signing != r.mat {
		ev.CertSigner = req.CertSigner // its chain ends at the named signer's root
	}
	msg, err := events.Encode(events.SubjectCertIssued, events.Meta{Source: i.Source(), Subject: ev.Serial, Time: now}, ev)
	var msgs []*nats.Msg
	if err == nil && !r.pod.IsZero() && i.cfg.Records != nil {
		var rec *nats.Msg
		rec, err = i.cfg.Records.Msg(leaf, r.pod, r.caller.PodUID, now)
		msgs = append(msgs, rec)
	}
	msgs = append(msgs, msg)
	if err != nil {
		i.metrics.SignFail.WithLabelValues(t).Inc()
		i.log.Error("record cert.issued failed", "serial", ev.Serial, "error", err)
		return nil, errf(events.CodeInternal, "could not record the certificate: %v", err)
	}
	i.again.issued(r.holder, now, leaf.NotAfter.Sub(now)) // its life from now: NotBefore is backdated
	res := leafResult(leaf, leafPEM, r.signing, r.mat)
	if req.CertSigner != "" && r.signing != r.mat {
		if res.Signer, err = i.vouched.get(i.cfg.TrustDomain, req.CertSigner, r.mat, r.signing); err != nil {
			i.metrics.SignFail.WithLabelValues(t).Inc()
			i.log.Error("named signer's roots not endorsed", "signer", req.CertSigner, "error", err)
			return nil, errf(events.CodeInternal, "endorse signer %q's roots: %v", req.CertSigner, err)
		}
	}
	return &issued{i: i, signed: now, res: res, ev: ev, msgs: msgs, via: r.via, src: r.caller.Source, key: r.key}, nil
}
