package signer

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/federation"
	"github.com/prometheus/client_golang/prometheus"
)

// maxStatusBytes bounds the federation status in a bundle reply (itself
// bounded by events.MaxEventSize with the home roots beside it).
const maxStatusBytes = 32 << 10

// maxRootInfo is how many roots of one domain the status lists one by one (the
// count is always there).
const maxRootInfo = 8

// status is the followed foreign domains' state as a bundle reply carries it:
// JSON endorsed by the current CA key, so that meshctl can tell it comes from
// the CA's holder. A domain that never worked is listed with its error.
func (f *fed) status() (json.RawMessage, []events.Endorsement, error) {
	m := f.s.auth.Current()
	if m == nil {
		return nil, nil, errors.New("CA not loaded yet")
	}
	st := events.FederationStatus{Signer: f.s.cfg.Instance, At: f.clk.Now().UTC(), Domains: []events.FederatedDomain{}}
	if f.follower != nil {
		for _, s := range f.follower.Status() {
			st.Domains = append(st.Domains, domainStatus(s))
		}
	}
	raw, err := json.Marshal(st)
	if err != nil {
		return nil, nil, err
	}
	// Over the bound: drop the per-root details, then whole domains (counted).
	if len(raw) > maxStatusBytes {
		for i := range st.Domains {
			st.Domains[i].RootInfo = nil
		}
		for raw, err = json.Marshal(st); err == nil && len(raw) > maxStatusBytes && len(st.Domains) > 0; raw, err = json.Marshal(st) {
			st.Domains, st.Truncated = st.Domains[:len(st.Domains)-1], st.Truncated+1
		}
		if err != nil {
			return nil, nil, err
		}
	}
	msg, err := events.FederationStatusEndorsedBytes(f.s.cfg.TrustDomain, raw)
	if err != nil {
		return nil, nil, err
	}
	id, sig, err := pki.Endorse(m.Key, msg)
	if err != nil {
		return nil, nil, fmt.Errorf("endorse federation status: %w", err)
	}
	e := events.Endorsement{KeyID: id, Signature: sig}
	if len(m.Chain) > 1 {
		e.Chain = m.IntermediatePEMs()
	}
	return raw, []events.Endorsement{e}, nil
}

// domainStatus is one domain's follower status in wire form.
func domainStatus(s federation.Status) events.FederatedDomain {
	d := events.FederatedDomain{TrustDomain: s.TrustDomain, Source: s.Where, Roots: s.Roots, Sequence: s.Sequence,
		RefreshHint: s.RefreshHint, LastSuccess: utc(s.FetchedAt), NextRefresh: utc(s.NextRefresh),
		Error: s.Err, ErrorReason: s.ErrReason, LastError: s.LastErr, LastErrorReason: s.LastErrReason,
		LastErrorAt: utc(s.LastErrAt), Errors: s.Errors}
	switch {
	case s.FetchedAt.IsZero():
		d.State = events.FederationNever
	case s.Err != "":
		d.State = events.FederationFailing
	default:
		d.State = events.FederationOK
	}
	for i, r := range s.RootInfo {
		if i == maxRootInfo {
			break
		}
		d.RootInfo = append(d.RootInfo, events.FederatedRoot{SHA256: r.SHA256, Subject: r.Subject, NotAfter: utc(r.NotAfter)})
	}
	return d
}

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}

// federationMetrics exports each followed domain's state at scrape time, from
// the follower's status: meshagent_signer_federation_*{trust_domain}.
type federationMetrics struct{ f *federation.Follower }

var _ prometheus.Collector = federationMetrics{}

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

func (federationMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{fedLastSuccess, fedLastError, fedNextRefresh, fedUp, fedRoots, fedRootsExpiry, fedErrors} {
		ch <- d
	}
}

func (m federationMetrics) Collect(ch chan<- prometheus.Metric) {
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
