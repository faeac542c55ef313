package federation

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// followerMetrics exports each followed domain's state at scrape time, from
// the follower's status: meshagent_signer_federation_*{trust_domain}.
type followerMetrics struct{ f *Follower }

var _ prometheus.Collector = followerMetrics{}

var (
	fedLastSuccess = prometheus.NewDesc("meshagent_signer_federation_last_success_timestamp_seconds",
		"When the foreign trust domain's bundle was last fetched and announced (Unix seconds); absent if never.", []string{"trust_domain"}, nil)
	fedLastError = prometheus.NewDesc("meshagent_signer_federation_last_error_timestamp_seconds",
		"When the last refresh of the foreign trust domain failed (Unix seconds); absent if never.", []string{"trust_domain"}, nil)
	fedNextRefresh = prometheus.NewDesc("meshagent_signer_federation_next_refresh_timestamp_seconds",
		"When the foreign trust domain is refreshed next (Unix seconds).", []string{"trust_domain"}, nil)
	fedUp = prometheus.NewDesc("meshagent_signer_federation_up",
		"1 if the last refresh of the foreign trust domain worked, 0 if it failed or none has worked yet.", []string{"trust_domain"}, nil)
	fedRoots = prometheus.NewDesc("meshagent_signer_federation_roots",
		"Roots held for the foreign trust domain (0 if none was ever fetched).", []string{"trust_domain"}, nil)
	fedRootsExpiry = prometheus.NewDesc("meshagent_signer_federation_roots_earliest_expiry_timestamp_seconds",
		"When the first of the foreign trust domain's held roots expires (Unix seconds).", []string{"trust_domain"}, nil)
	fedErrors = prometheus.NewDesc("meshagent_signer_federation_refresh_errors_total",
		"Failed refreshes of the foreign trust domain by reason (too_large, redirect, http_status, connect, parse, no_roots, file, announce).", []string{"trust_domain", "reason"}, nil)
)

func (followerMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{fedLastSuccess, fedLastError, fedNextRefresh, fedUp, fedRoots, fedRootsExpiry, fedErrors} {
		ch <- d
	}
}

func (m followerMetrics) Collect(ch chan<- prometheus.Metric) {
	unix := func(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
	for _, s := range m.f.Status() {
		td := s.TrustDomain
		if !s.FetchedAt.IsZero() {
			ch <- prometheus.MustNewConstMetric(fedLastSuccess, prometheus.GaugeValue, unix(s.FetchedAt), td)
		}
		if !s.LastErrAt.IsZero() {
			ch <- prometheus.MustNewConstMetric(fedLastError, prometheus.GaugeValue, unix(s.LastErrAt), td)
		}
		if !s.NextRefresh.IsZero() {
			ch <- prometheus.MustNewConstMetric(fedNextRefresh, prometheus.GaugeValue, unix(s.NextRefresh), td)
		}
		up := 0.0
		if !s.FetchedAt.IsZero() && s.Err == "" {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(fedUp, prometheus.GaugeValue, up, td)
		ch <- prometheus.MustNewConstMetric(fedRoots, prometheus.GaugeValue, float64(s.Roots), td)
		var first time.Time
		for _, r := range s.RootInfo {
			if first.IsZero() || r.NotAfter.Before(first) {
				first = r.NotAfter
			}
		}
		if !first.IsZero() {
			ch <- prometheus.MustNewConstMetric(fedRootsExpiry, prometheus.GaugeValue, unix(first), td)
		}
		for reason, n := range s.Errors {
			ch <- prometheus.MustNewConstMetric(fedErrors, prometheus.CounterValue, float64(n), td, reason)
		}
	}
}
