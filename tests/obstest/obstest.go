// Package obstest reads a service's metrics in its tests: the value of a counter or
// gauge as the registry pkg/obs serves would report it, without an HTTP scrape.
package obstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric is the sum of the counter and gauge series of the metric name whose
// labels include labels (nil: every series); 0 when there is none.
func Metric(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}
