package sdsedge

import (
	"slices"
	"time"

	"github.com/meshagent/meshagent/pkg/atomicfile/certdir"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// sdsObserver turns what the SDS server does into events and metrics.
type sdsObserver struct{ e *Edge }

func (h sdsObserver) Served(node string, en *secrets.Entry) {
	h.e.m.Served.WithLabelValues(en.Name).Inc()
	h.e.publish(events.PodEventSecretPushed, events.SecretPushed{Pod: h.e.cfg.PodRef(), Resource: en.Name, Serial: en.Serial,
		Version: en.Version, Streams: 1, Kind: "served"})
}

func (h sdsObserver) Nacked(node string, names []string, version, nonce, msg string) {
	if len(names) == 0 {
		names = []string{""}
	}
	for _, n := range names {
		h.e.m.Nacks.WithLabelValues(n).Inc()
		h.e.publish(events.PodEventSDSNack, events.SDSNack{Pod: h.e.cfg.PodRef(), Node: node, Resource: n,
			Version: version, Nonce: nonce, Error: truncate(msg, 1024)})
	}
}

// Asked: Envoy asking for `default` again (a new stream, a restart, a retry after
// an error) is a reason to retry a failing renewal now, as Istio's agent does.
func (h sdsObserver) Asked(node string, names []string) {
	if mgr := h.e.mgr.Load(); mgr != nil && slices.Contains(names, secrets.Default) {
		mgr.RetryNow("envoy asked for " + secrets.Default)
	}
}

func (h sdsObserver) Stream(rpc string, delta int) {
	h.e.m.Connections.WithLabelValues(rpc).Add(float64(delta))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// identityObserver turns the CA flow's changes into events, files (OUTPUT_CERTS)
// and metrics.
type identityObserver struct{ e *Edge }

func (s identityObserver) Changed(en *secrets.Entry, streams int) {
	s.e.Changed(en, streams)
	s.e.wakeCertWatch()
}

func (s identityObserver) Files(keyPEM, chainPEM, rootsPEM []byte) {
	dir := s.e.cfg.Cert.OutputDir
	if dir == "" {
		return
	}
	if err := certdir.Write(dir, keyPEM, chainPEM, rootsPEM); err != nil {
		s.e.log.Error("cannot write output certificates", "dir", dir, "error", err)
	}
}

func (s identityObserver) TrustRejected(source string) {
	s.e.m.TrustRejected.WithLabelValues(source).Inc()
}

func (s identityObserver) TrustBootstrapped(mode string) {
	s.e.m.TrustBootstrap.WithLabelValues(mode).Set(1)
}

func (s identityObserver) CSR(err error, retry bool) {
	m := s.e.m
	m.CSRSent.Inc()
	if retry {
		m.CSRRetried.Inc()
	}
	if err != nil {
		m.CSRFailed.Inc()
	}
	if mgr := s.e.mgr.Load(); mgr != nil {
		bus.SetUrgent(err != nil && nearExpiry(mgr.Status().NotAfter, s.e.d.Clock.Now()))
	}
	s.e.wakeCertWatch()
}

// urgentWithin is how close to its expiry a certificate that failed to renew makes
// the pod's bus reconnects urgent (bus.SetUrgent): two of Reconnect's longest waits.
var urgentWithin = 2 * bus.Reconnect.Max

// nearExpiry: a certificate (notAfter not zero) that expires within urgentWithin of now, or has.
func nearExpiry(notAfter, now time.Time) bool {
	return !notAfter.IsZero() && !now.Before(notAfter.Add(-urgentWithin))
}
