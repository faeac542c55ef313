package relay

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the relay's Prometheus series. Type URLs label most of them; a
// misbehaving client cannot blow up cardinality: past maxTypes distinct type URLs
// the label is "other".
type metrics struct {
	requests, responses         *prometheus.CounterVec
	requestBytes, responseBytes *prometheus.CounterVec
	nacks                       *prometheus.CounterVec
	consumed                    *prometheus.CounterVec
	upstreamFailures            prometheus.Counter
	upstreamTerminations        prometheus.Counter
	streams                     *prometheus.GaugeVec

	mu    sync.Mutex
	types map[string]struct{}
}

const maxTypes = 64

// EventsDropped names the counter of the relay's events not published (the
// service's pkg/outbox registers it).
const EventsDropped = "meshagent_xds_relay_events_dropped_total"

func newMetrics(reg prometheus.Registerer) *metrics {
	typ := []string{"type"}
	m := &metrics{
		requests:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_xds_relay_requests_total", Help: "Discovery requests relayed upstream, by type URL (including the relay's own ACKs)."}, typ),
		responses:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_xds_relay_responses_total", Help: "Discovery responses received from upstream, by type URL."}, typ),
		requestBytes:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_xds_relay_request_bytes_total", Help: "Bytes of discovery requests relayed upstream, by type URL."}, typ),
		responseBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_xds_relay_response_bytes_total", Help: "Bytes of discovery responses received from upstream, by type URL."}, typ),
		nacks:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_xds_relay_nacks_total", Help: "NACKs sent by Envoy or by an agent-consumed handler, by type URL."}, typ),
		consumed:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshagent_xds_relay_consumed_total", Help: "Responses consumed by the relay itself, by type URL and result."}, []string{"type", "result"}),
		upstreamFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshagent_xds_relay_upstream_connect_failures_total",
			Help: "Upstream streams that could not be opened."}),
		upstreamTerminations: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshagent_xds_relay_upstream_terminations_total",
			Help: "Relayed streams ended by the upstream (error or close)."}),
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshagent_xds_relay_streams", Help: "Live relayed streams, by mode (sotw or delta)."}, []string{"mode"}),
		types:   map[string]struct{}{},
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.responses, m.requestBytes, m.responseBytes, m.nacks, m.consumed,
			m.upstreamFailures, m.upstreamTerminations, m.streams)
	}
	return m
}

func (m *metrics) label(typeURL string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.types[typeURL]; ok {
		return typeURL
	}
	if len(m.types) >= maxTypes {
		return "other"
	}
	m.types[typeURL] = struct{}{}
	return typeURL
}

// typeSeries are one type URL's request and response series.
type typeSeries struct {
	label                    string
	requests, requestBytes   prometheus.Counter
	responses, responseBytes prometheus.Counter
}

// streamSeries is a cache of typeSeries by type URL for one goroutine of one
// stream (it is not safe for concurrent use), so that counting a message takes
// no lock and hashes no label. It holds at most maxTypes entries
// (type URLs past the shared limit all count as "other" and are not cached).
type streamSeries struct {
	m      *metrics
	byType map[string]*typeSeries
	other  *typeSeries
}

func (m *metrics) forStream() *streamSeries {
	return &streamSeries{m: m, byType: map[string]*typeSeries{}}
}

func (c *streamSeries) of(typeURL []byte) *typeSeries {
	if t, ok := c.byType[string(typeURL)]; ok {
		return t
	}
	label := c.m.label(string(typeURL))
	if label == "other" && c.other != nil {
		return c.other
	}
	t := &typeSeries{label: label,
		requests: c.m.requests.WithLabelValues(label), requestBytes: c.m.requestBytes.WithLabelValues(label),
		responses: c.m.responses.WithLabelValues(label), responseBytes: c.m.responseBytes.WithLabelValues(label)}
	if label == "other" {
		c.other = t
	} else {
		c.byType[label] = t
	}
	return t
}
