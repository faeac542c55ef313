package edge

import (
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// hooks turn what the SDS server does into events and metrics.
type hooks struct{ e *Edge }

func (h hooks) Served(node string, en *secrets.Entry) {
	h.e.m.Served.WithLabelValues(en.Name).Inc()
	h.e.publish(events.PodEventSecretPushed, events.SecretPushed{Pod: h.e.cfg.Pod.ID, Resource: en.Name, Serial: en.Serial,
		Version: en.Version, Streams: 1, Kind: "served"})
}

func (h hooks) Nacked(node string, names []string, version, nonce, msg string) {
	if len(names) == 0 {
		names = []string{""}
	}
	for _, n := range names {
		h.e.m.Nacks.WithLabelValues(n).Inc()
		h.e.publish(events.PodEventSDSNack, events.SDSNack{Pod: h.e.cfg.Pod.ID, Node: node, Resource: n,
			Version: version, Nonce: nonce, Error: truncate(msg, 1024)})
	}
}

func (h hooks) Stream(rpc string, delta int) {
	h.e.m.Connections.WithLabelValues(rpc).Add(float64(delta))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// sink turns the CA flow's changes into events, files and metrics.
type sink struct{ e *Edge }

func (s sink) Changed(en *secrets.Entry, streams int) { s.e.Changed(en, streams) }

func (s sink) Files(keyPEM, chainPEM, rootsPEM []byte) {
	if s.e.out == nil {
		return
	}
	if err := s.e.out.Write(keyPEM, chainPEM, rootsPEM); err != nil {
		s.e.log.Error("cannot write output certificates", "dir", s.e.cfg.Cert.OutputDir, "error", err)
	}
}

func (s sink) TrustRejected(source string) { s.e.m.TrustRejected.WithLabelValues(source).Inc() }

func (s sink) TrustBootstrapped(mode string) { s.e.m.TrustBootstrap.WithLabelValues(mode).Set(1) }

func (s sink) CSR(err error, retry bool) {
	m := s.e.m
	m.CSRSent.Inc()
	if retry {
		m.CSRRetried.Inc()
	}
	if err != nil {
		m.CSRFailed.Inc()
	}
}
