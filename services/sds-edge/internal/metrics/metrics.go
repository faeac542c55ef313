// Package metrics holds sds-edge's Prometheus metrics.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// EventsDropped names the counter of events not published (pkg/outbox registers it).
const EventsDropped = "meshagent_sds_edge_events_dropped_total"

// Metrics are sds-edge's counters and gauges.
type Metrics struct {
	CSRSent     prometheus.Counter
	CSRFailed   prometheus.Counter
	CSRRetried  prometheus.Counter
	Connections *prometheus.GaugeVec   // by rpc: stream, delta, fetch
	Pushes      *prometheus.CounterVec // by resource
	Served      *prometheus.CounterVec // by resource
	Nacks       *prometheus.CounterVec // by resource
	// TrustRejected counts trust bundles and signed chains refused, by source
	// (trust.changed, bundle, sign-reply).
	TrustRejected *prometheus.CounterVec
	// TrustBootstrap is 1 for the mode the first bundle was trusted in (anchors,
	// first-use), once it has been.
	TrustBootstrap *prometheus.GaugeVec
}

// New registers the metrics on reg; expiry is read from store at scrape time,
// against clk.
func New(reg prometheus.Registerer, store *secrets.Store, clk clock.Clock) *Metrics {
	m := &Metrics{
		CSRSent:     prometheus.NewCounter(prometheus.CounterOpts{Name: "meshagent_sds_edge_csr_sent_total", Help: "CSRs sent to the CA."}),
		CSRFailed:   prometheus.NewCounter(prometheus.CounterOpts{Name: "meshagent_sds_edge_csr_failed_total", Help: "CSRs that failed."}),
		CSRRetried:  prometheus.NewCounter(prometheus.CounterOpts{Name: "meshagent_sds_edge_csr_retried_total", Help: "CSRs sent as retries."}),
		Connections: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshagent_sds_edge_sds_connections", Help: "Open SDS streams and calls."}, []string{"rpc"}),
		Pushes:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_sds_edge_pushes_total", Help: "Secret changes pushed to streams."}, []string{"resource"}),
		Served:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_sds_edge_served_total", Help: "Secrets served in answer to requests."}, []string{"resource"}),
		Nacks:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_sds_edge_nacks_total", Help: "Secrets rejected by clients."}, []string{"resource"}),
		TrustRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_sds_edge_trust_rejected_total",
			Help: "Trust bundles and signed chains refused because they do not verify under the roots the pod trusts, by source."}, []string{"source"}),
		TrustBootstrap: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshagent_sds_edge_trust_bootstrap",
			Help: "1 for how the first trust bundle was trusted: anchors (-trust-anchors-file) or first-use."}, []string{"mode"}),
	}
	servingExpired := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meshagent_sds_edge_serving_expired",
		Help: "1 while the certificate served as default is past its NotAfter (it is still served, and /readyz fails)."}, func() float64 {
		if en, ok := store.Get(secrets.Default); ok && !en.NotAfter.IsZero() && !clk.Now().Before(en.NotAfter) {
			return 1
		}
		return 0
	})
	reg.MustRegister(servingExpired, m.CSRSent, m.CSRFailed, m.CSRRetried, m.Connections, m.Pushes, m.Served, m.Nacks, m.TrustRejected, m.TrustBootstrap,
		&expiry{store: store, clk: clk, desc: prometheus.NewDesc("meshagent_sds_edge_cert_expiry_seconds",
			"Seconds until the earliest certificate of a resource expires.", []string{"resource"}, nil)})
	return m
}

type expiry struct {
	store *secrets.Store
	clk   clock.Clock
	desc  *prometheus.Desc
}

func (e *expiry) Describe(ch chan<- *prometheus.Desc) { ch <- e.desc }

func (e *expiry) Collect(ch chan<- prometheus.Metric) {
	now := e.clk.Now()
	for _, en := range e.store.All() {
		if en.NotAfter.IsZero() {
			continue
		}
		ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, en.NotAfter.Sub(now).Seconds(), en.Name)
	}
}
