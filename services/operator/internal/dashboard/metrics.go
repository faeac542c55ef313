package dashboard

import (
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/pkg/inventory/fleetindex"
	"github.com/prometheus/client_golang/prometheus"
)

// ExpiryBuckets are the upper bounds of the time-to-expiry buckets of
// meshagent_fleet_certificates, with their labels.
var ExpiryBuckets = []struct {
	Label string
	Upto  time.Duration
}{
	{"expired", 0}, {"1h", time.Hour}, {"6h", 6 * time.Hour}, {"24h", 24 * time.Hour},
	{"7d", 7 * 24 * time.Hour}, {"30d", 30 * 24 * time.Hour}, {"later", 1<<63 - 1},
}

// ExpiryBucket is the label of the bucket a certificate with left time to live is in.
func ExpiryBucket(left time.Duration) string {
	for _, b := range ExpiryBuckets {
		if left <= b.Upto {
			return b.Label
		}
	}
	return "later"
}

// fleetMetrics are the fleet's metrics, computed from the events this replica sees
// live (counters) and from the inventory (gauges, at scrape time).
type fleetMetrics struct {
	issued   *prometheus.CounterVec
	renewals *prometheus.CounterVec
	failures *prometheus.CounterVec
	nacks    *prometheus.CounterVec
	pushes   prometheus.Counter
	events   *prometheus.CounterVec
}

func newFleetMetrics(reg prometheus.Registerer, index func(func(*fleetindex.Index)) bool, clk clock.Clock) (*fleetMetrics, error) {
	m := &fleetMetrics{
		issued: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_fleet_certs_issued_total",
			Help: "Certificates issued in the fleet (cert.issued), by signer."}, []string{"signer"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_fleet_renewals_total",
			Help: "Renewals the rotators asked for (rotation.renew_sent), by reason."}, []string{"reason"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_fleet_failures_total",
			Help: "Failures seen in the events, by reason: sds_nack, xds_nack, renewal_retry (a renewal that brought no new certificate)."}, []string{"reason"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_fleet_nacks_total",
			Help: "Responses Envoy rejected, by xDS type URL."}, []string{"type_url"}),
		pushes: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshagent_fleet_sds_pushes_total",
			Help: "Secrets served or pushed to Envoy over SDS (rate() gives pushes per second)."}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_fleet_events_total",
			Help: "Events seen on the bus, by type."}, []string{"type"}),
	}
	for _, c := range []prometheus.Collector{m.issued, m.renewals, m.failures, m.nacks, m.pushes, m.events, &inventoryCollector{index: index, clk: clk}} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("fleet metrics: %w", err)
		}
	}
	return m, nil
}

const secretTypeURL = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

func (m *fleetMetrics) observe(e auditlog.Entry) {
	if e.Err != nil {
		m.events.WithLabelValues("undecodable").Inc()
		return
	}
	m.events.WithLabelValues(auditlog.ShortType(e.Meta.Type)).Inc()
	switch p := e.Payload.(type) {
	case events.CertIssued:
		m.issued.WithLabelValues(p.Signer).Inc()
	case events.RenewDue:
		m.renewals.WithLabelValues(p.Reason).Inc()
		if p.Reason == events.RenewRetry {
			m.failures.WithLabelValues("renewal_retry").Inc()
		}
	case events.SecretPushed:
		m.pushes.Inc()
	case events.SDSNack:
		m.failures.WithLabelValues("sds_nack").Inc()
		m.nacks.WithLabelValues(secretTypeURL).Inc()
	case events.XDSNack:
		m.failures.WithLabelValues("xds_nack").Inc()
		m.nacks.WithLabelValues(p.TypeURL).Inc()
	}
}

// inventoryCollector reports the inventory's gauges at scrape time.
type inventoryCollector struct {
	index func(func(*fleetindex.Index)) bool // runs its argument on the index, false before the watch
	clk   clock.Clock
}

var (
	certsDesc = prometheus.NewDesc("meshagent_fleet_certificates",
		"Current certificates in the inventory, by time left to expiry (upper bound of the bucket).", []string{"expires_in"}, nil)
	rootDesc = prometheus.NewDesc("meshagent_fleet_root_expiry_seconds",
		"Seconds until each root of the trust bundle expires.", []string{"fingerprint"}, nil)
	podsDesc = prometheus.NewDesc("meshagent_fleet_pods",
		"Pods holding a certificate in the inventory, by state (up, down).", []string{"state"}, nil)
	benchDesc = prometheus.NewDesc("meshagent_fleet_bench_certificates",
		"Certificates of meshctl bench (namespace meshagent-bench) in the inventory, left out of the other gauges.", nil, nil)
	skippedDesc = prometheus.NewDesc("meshagent_fleet_inventory_records_skipped",
		"Inventory records that could not be read and are left out of the other gauges (written malformed with the inventory credential).", nil, nil)
)

func (c *inventoryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- certsDesc
	ch <- rootDesc
	ch <- podsDesc
	ch <- benchDesc
	ch <- skippedDesc
}

// Collect reads the index's counts: a scrape costs the number of buckets,
// namespaces and roots, not of certificates.
func (c *inventoryCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.clk.Now()
	var counts inventory.Counts
	var skipped int
	var trust *inventory.Trust
	byBucket := make([]int, len(ExpiryBuckets))
	ok := c.index(func(ix *fleetindex.Index) {
		counts, trust = ix.Counts(now), ix.Trust()
		_, skipped = ix.Len()
		below := 0
		for i, b := range ExpiryBuckets {
			n := counts.Certificates
			if b.Upto < 1<<62 {
				n = ix.ExpiringBy(now.Add(b.Upto))
			}
			byBucket[i], below = n-below, n
		}
	})
	if !ok {
		return
	}
	for i, b := range ExpiryBuckets {
		ch <- prometheus.MustNewConstMetric(certsDesc, prometheus.GaugeValue, float64(byBucket[i]), b.Label)
	}
	ch <- prometheus.MustNewConstMetric(skippedDesc, prometheus.GaugeValue, float64(skipped))
	ch <- prometheus.MustNewConstMetric(benchDesc, prometheus.GaugeValue, float64(counts.Bench))
	ch <- prometheus.MustNewConstMetric(podsDesc, prometheus.GaugeValue, float64(counts.Pods), "up")
	ch <- prometheus.MustNewConstMetric(podsDesc, prometheus.GaugeValue, float64(counts.DownPods), "down")
	if trust != nil {
		for _, r := range trust.Roots {
			ch <- prometheus.MustNewConstMetric(rootDesc, prometheus.GaugeValue, r.NotAfter.Sub(now).Seconds(), r.Fingerprint)
		}
	}
}
