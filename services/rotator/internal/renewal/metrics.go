package renewal

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	events         *prometheus.CounterVec
	sent           *prometheus.CounterVec
	rateLimited    prometheus.Counter
	retries        prometheus.Counter
	expired        prometheus.Counter
	sendErrors     prometheus.Counter
	conflicts      prometheus.Counter
	rebuildSeconds prometheus.Gauge
	rebuildChanges prometheus.Gauge
	certRejected   *prometheus.CounterVec
	trustBootstrap *prometheus.GaugeVec
}

func newMetrics(r *Replica, reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_rotator_events_total",
			Help: "Events consumed, by kind and result (scheduled, duplicate, stale, expired, unscheduled, retired, applied, unchanged, rejected)."}, []string{"kind", "result"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_rotator_renew_sent_total",
			Help: "renew-due sent, by reason."}, []string{"reason"}),
		rateLimited:    newCounter("meshagent_rotator_renew_rate_limited_total", "renew-due that waited for the fleet-wide rate limit."),
		retries:        newCounter("meshagent_rotator_renew_retries_total", "renew-due sent again because no new certificate came by the deadline."),
		expired:        newCounter("meshagent_rotator_expired_total", "Entries retired because their certificate expired without a successor."),
		sendErrors:     newCounter("meshagent_rotator_send_errors_total", "renew-due events that could not be sent, or their audit records encoded (audit records the stream never took: meshagent_rotator_audit_dropped_total)."),
		conflicts:      newCounter("meshagent_rotator_store_conflicts_total", "Entries adopted from the bucket after another writer changed them."),
		rebuildSeconds: newGauge("meshagent_rotator_rebuild_seconds", "How long the last schedule rebuild from the bucket took."),
		rebuildChanges: newGauge("meshagent_rotator_rebuild_changes", "Bucket changes read by the last rebuild (few when the standby schedule was warm)."),
		certRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_rotator_cert_rejected_total",
			Help: "cert.issued records refused, by reason (no_chain, bad_chain, mismatch, untrusted)."}, []string{"reason"}),
		trustBootstrap: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshagent_rotator_trust_bootstrap",
			Help: "1 for how the first trust bundle was trusted: anchors, first-use, or kept (the bundle an earlier leader checked, from the schedule bucket)."}, []string{"mode"}),
	}
	for _, c := range []prometheus.Collector{m.events, m.sent, m.rateLimited, m.retries, m.expired,
		m.sendErrors, m.conflicts, m.rebuildSeconds, m.rebuildChanges, m.certRejected, m.trustBootstrap, &scheduleCollector{r: r}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func newCounter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func newGauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

var (
	descScheduled = prometheus.NewDesc("meshagent_rotator_scheduled", "Entries (pod, resource) in the schedule.", nil, nil)
	descDue       = prometheus.NewDesc("meshagent_rotator_due", "Renewals due now, waiting for the rate limit.", nil, nil)
	descOverdue   = prometheus.NewDesc("meshagent_rotator_overdue", "Renewals sent with no new certificate by the retry deadline.", nil, nil)
	descMinTTE    = prometheus.NewDesc("meshagent_rotator_min_time_to_expiry_seconds", "Smallest time to expiry in the fleet (+Inf when empty).", nil, nil)
	descLeader    = prometheus.NewDesc("meshagent_rotator_leader", "1 while this replica holds the lease.", nil, nil)
)

// scheduleCollector reads the schedule once per scrape.
type scheduleCollector struct{ r *Replica }

func (c *scheduleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descScheduled, descDue, descOverdue, descMinTTE, descLeader} {
		ch <- d
	}
}

func (c *scheduleCollector) Collect(ch chan<- prometheus.Metric) {
	leader := 0.0
	if c.r.Leader() {
		leader = 1
	}
	ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, leader)
	st, ok := c.r.Stats()
	if !ok {
		return
	}
	tte := math.Inf(1)
	if !st.MinNotAfter.IsZero() {
		tte = st.MinNotAfter.Sub(c.r.clk.Now()).Round(time.Millisecond).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(descScheduled, prometheus.GaugeValue, float64(st.Scheduled))
	ch <- prometheus.MustNewConstMetric(descDue, prometheus.GaugeValue, float64(st.Due))
	ch <- prometheus.MustNewConstMetric(descOverdue, prometheus.GaugeValue, float64(st.Overdue))
	ch <- prometheus.MustNewConstMetric(descMinTTE, prometheus.GaugeValue, tte)
}
