package issuer

import (
	"time"

	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the signer's Prometheus metrics (Istio's citadel_server_* counterparts
// in brackets): CSRs received [csr_count], authentication failures
// [authentication_failure_count], CSR parse failures [csr_parsing_err_count], signing
// failures [csr_sign_err_count], certificates issued [success_cert_issuance_count],
// root and chain expiry [root_cert_expiry_seconds, cert_chain_expiry_seconds].
type Metrics struct {
	Received     *prometheus.CounterVec
	AuthFailures *prometheus.CounterVec
	ParseFail    *prometheus.CounterVec
	SignFail     *prometheus.CounterVec
	Rejected     *prometheus.CounterVec
	Issued       *prometheus.CounterVec
	// TokensVerified counts bearer tokens verified per request (not those the bus
	// auth callout verifies once per connection).
	TokensVerified *prometheus.CounterVec
	// Clamped counts pods' requests whose TTL was cut to the pods' cap.
	Clamped *prometheus.CounterVec
	// Expired counts requests dropped unsigned because their deadline had passed.
	Expired *prometheus.CounterVec
	// Repeats counts requests answered with the certificate already recorded for
	// the same request (its first answer was lost): no certificate issued.
	Repeats *prometheus.CounterVec
}

// NewMetrics registers the metrics on reg; the expiry gauges read auth at scrape time.
func NewMetrics(reg prometheus.Registerer, auth *ca.Authority, clk clock.Clock) *Metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "meshagent", Subsystem: "signer", Name: name, Help: help}, labels)
		reg.MustRegister(c)
		return c
	}
	m := &Metrics{
		Received:       counter("csr_received_total", "CSRs received, by transport.", "transport"),
		AuthFailures:   counter("auth_failures_total", "Requests whose credential did not authenticate, by transport.", "transport"),
		ParseFail:      counter("csr_parse_failures_total", "CSRs that did not parse or whose signature did not verify, by transport.", "transport"),
		SignFail:       counter("sign_failures_total", "Requests that failed while signing or recording the certificate, by transport.", "transport"),
		Rejected:       counter("rejected_total", "Requests rejected before signing, by transport and reason.", "transport", "reason"),
		Issued:         counter("certs_issued_total", "Certificates issued, by transport.", "transport"),
		Clamped:        counter("ttl_clamped_total", "Pods' requests for a longer certificate than -pod-max-ttl, given that cap instead, by transport.", "transport"),
		Expired:        counter("requests_expired_total", "Sign requests dropped unsigned because their requester had stopped waiting (the request's deadline passed before signing), by transport.", "transport"),
		Repeats:        counter("requests_repeated_total", "Requests answered with the certificate this replica recorded for the same holder, CSR, lifetime and CA within the last minute (a requester asking again after its answer was lost), not a new one, by transport.", "transport"),
		TokensVerified: counter("tokens_verified_total", "Bearer tokens verified per request, by transport (requests on identity sign subjects carry none to verify).", "transport"),
	}
	gauge := func(name, help string, f func(*ca.Material) time.Time) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "meshagent", Subsystem: "signer", Name: name, Help: help}, func() float64 {
			mat := auth.Current()
			if mat == nil {
				return 0
			}
			return f(mat).Sub(clk.Now()).Seconds()
		}))
	}
	gauge("root_expiry_seconds", "Seconds until the current root expires.", (*ca.Material).RootNotAfter)
	gauge("chain_expiry_seconds", "Seconds until the first certificate of the signing chain expires.", (*ca.Material).NotAfter)
	return m
}
