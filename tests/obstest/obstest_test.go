package obstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestMetricSumsTheSeriesWithTheLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"type", "result"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "y", Help: "y"})
	reg.MustRegister(c, g)
	c.WithLabelValues("a", "ok").Add(2)
	c.WithLabelValues("a", "nack").Add(3)
	c.WithLabelValues("b", "ok").Add(5)
	g.Set(7)
	for _, tc := range []struct {
		name   string
		metric string
		labels map[string]string
		want   float64
	}{
		{"every series", "x_total", nil, 10},
		{"by one label", "x_total", map[string]string{"type": "a"}, 5},
		{"one series", "x_total", map[string]string{"type": "a", "result": "nack"}, 3},
		{"no such series", "x_total", map[string]string{"type": "c"}, 0},
		{"a gauge", "y", nil, 7},
		{"no such metric", "z", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Metric(t, reg, tc.metric, tc.labels); got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}
