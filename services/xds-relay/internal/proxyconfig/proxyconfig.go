// Package proxyconfig consumes Istio's ProxyConfig resource on the relay's
// upstream stream (the relay asks for it itself; Envoy never sees it) and hands
// its extra trust anchors (ProxyConfig.ca_certificates_pem) to the pod's sds-edge,
// by publishing events.TrustAnchors on events.PodAnchorsSubject(pod), and to the
// relay's own upstream TLS verification. It reads that one field off the wire
// rather than link istio.io/api's generated types (docs/benchmarks.md, "Per-pod
// memory"); its tests encode ProxyConfig with them.
package proxyconfig

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/xdswire"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"
)

// TypeURL is Istio's ProxyConfig type, as istiod's PCDS serves it.
const TypeURL = "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig"

// Sender publishes a message on core NATS (*nats.Conn implements it).
type Sender interface {
	PublishMsg(*nats.Msg) error
}

// UpstreamTLS is the relay's own upstream verification, which takes the anchors
// too (*upstream.Dialer implements it).
type UpstreamTLS interface {
	SetAnchors([]*x509.Certificate) error
}

// Handler is the relay.Handler for ProxyConfig.
type Handler struct {
	pod     events.PodRef
	subject string
	bus     Sender
	tls     UpstreamTLS
	log     hclog.Logger

	mu   sync.Mutex
	last []string // the anchors last handed on, nil before the first
}

// New returns the handler for pod. tls may be nil: the anchors then reach only sds-edge.
func New(pod events.PodRef, bus Sender, tls UpstreamTLS, log hclog.Logger) (*Handler, error) {
	subj, err := events.PodAnchorsSubject(pod)
	if err != nil {
		return nil, err
	}
	return &Handler{pod: pod, subject: subj, bus: bus, tls: tls, log: log}, nil
}

// TypeURL implements relay.Handler.
func (h *Handler) TypeURL() string { return TypeURL }

// Handle validates every anchor of the response; a bad one rejects the whole
// response (and changes nothing). A good set is published to sds-edge and, when
// it changed, applied to the relay's upstream TLS.
func (h *Handler) Handle(_ context.Context, resources []*anypb.Any) error {
	var certs []*x509.Certificate
	seen := map[string]bool{}
	for i, a := range resources {
		if a.GetTypeUrl() != TypeURL {
			return fmt.Errorf("resource %d: type %q, want %s", i, a.GetTypeUrl(), TypeURL)
		}
		pems, err := caCertificatesPEM(a.GetValue())
		if err != nil {
			return fmt.Errorf("resource %d: decode ProxyConfig: %w", i, err)
		}
		for j, p := range pems {
			cs, err := pki.ParseCertsPEM([]byte(p))
			if err != nil {
				return fmt.Errorf("resource %d: ca_certificates_pem[%d]: %w", i, j, err)
			}
			for _, c := range cs {
				if !c.IsCA {
					return fmt.Errorf("resource %d: ca_certificates_pem[%d]: %q is not a CA certificate", i, j, c.Subject)
				}
				if fp := pki.Fingerprint(c); !seen[fp] {
					seen[fp] = true
					certs = append(certs, c)
				}
			}
		}
	}
	roots := pki.CertPEMs(certs)
	if roots == nil {
		roots = []string{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// Every accepted response is published, changed or not: sds-edge replaces its
	// set, so a repeat is harmless and heals an sds-edge that restarted and missed
	// the last one (core NATS keeps nothing for late subscribers).
	msg, err := events.NewMsg(h.subject, "xds-relay/"+h.pod.String(), events.TrustAnchors{Pod: h.pod, Roots: roots})
	if err != nil {
		return fmt.Errorf("trust anchors: %w", err)
	}
	if err := h.bus.PublishMsg(msg); err != nil {
		return fmt.Errorf("publish trust anchors: %w", err)
	}
	if h.last != nil && slices.Equal(h.last, roots) {
		return nil
	}
	// Only a change rebuilds the relay's own upstream TLS (which retires its connection).
	if h.tls != nil {
		if err := h.tls.SetAnchors(certs); err != nil {
			// The anchors reached sds-edge; the relay's own TLS keeps its old pool.
			h.log.Warn("cannot apply trust anchors to upstream tls", "error", err)
		}
	}
	h.last = roots
	h.log.Info("trust anchors updated", "count", len(roots), "subject", h.subject)
	return nil
}

// caCertificatesPEM is ProxyConfig.ca_certificates_pem (field 34, repeated
// string) of the ProxyConfig b; every other field is skipped.
func caCertificatesPEM(b []byte) ([]string, error) {
	var pems []string
	err := xdswire.Fields(b, func(f xdswire.Field) error {
		if !f.Is(34, protowire.BytesType) {
			return nil
		}
		s, err := f.String()
		pems = append(pems, s)
		return err
	})
	return pems, err
}
