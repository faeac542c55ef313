package relay

import (
	"google.golang.org/grpc/codes"

	"github.com/meshagent/meshagent/pkg/xdswire"
)

// HealthInfoType is the type URL of the agent's health reports to istiod (Istio's
// model.HealthInfoType): a request of that type with no error detail says the
// workload is healthy, one with an error detail (code Internal, the probe's
// message) that it is not. istiod sends no response to it, and Envoy never sees it.
const HealthInfoType = "type.googleapis.com/istio.v1.HealthInformation"

// listenerType is LDS's type URL: a stream's health reports go upstream after
// Envoy's first LDS request, as Istio's agent sends them.
const listenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"

// Health is the workload's health as the agent last found it.
type Health struct {
	Healthy bool
	Message string // why not, when not healthy
}

// HealthRequest is the state-of-the-world request that reports h, exactly as
// Istio's agent builds it (xds_proxy.go): only the type URL, and an error detail
// of code Internal with the probe's message when h is not healthy.
func HealthRequest(h Health) *xdswire.DiscoveryRequest {
	return &xdswire.DiscoveryRequest{TypeURL: HealthInfoType, ErrorDetail: healthDetail(h)}
}

// DeltaHealthRequest is HealthRequest on a delta stream.
func DeltaHealthRequest(h Health) *xdswire.DeltaDiscoveryRequest {
	return &xdswire.DeltaDiscoveryRequest{TypeURL: HealthInfoType, ErrorDetail: healthDetail(h)}
}

func healthDetail(h Health) *xdswire.Status {
	if h.Healthy {
		return nil
	}
	return &xdswire.Status{Code: int32(codes.Internal), Message: h.Message}
}

// ReportHealth sends h upstream on every stream whose Envoy has asked for LDS,
// and keeps it for the streams that ask later (a reconnected Envoy's fresh
// upstream stream gets the last report, as with Istio's agent, so that istiod,
// which may be another replica, learns the health again).
func (s *Server) ReportHealth(h Health) {
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	s.health = &h
	for _, st := range s.live {
		if st.ldsAsked {
			st.sendHealth(h)
		}
	}
}

// askedLDS marks st as past Envoy's first LDS request and sends it the last
// health report, if there is one. Called from the stream's Envoy reader after the
// LDS request is queued; under the lock ReportHealth takes, so that a report is
// sent on st exactly once, by one or the other.
func (st *stream) askedLDS() {
	st.s.liveMu.Lock()
	defer st.s.liveMu.Unlock()
	if st.ldsAsked {
		return
	}
	st.ldsAsked = true
	if st.s.health != nil {
		st.sendHealth(*st.s.health)
	}
}

// sendHealth queues a health report on st (the caller holds liveMu).
func (st *stream) sendHealth(h Health) {
	var m xdswire.Message = HealthRequest(h)
	if st.mode.name == delta.name {
		m = DeltaHealthRequest(h)
	}
	b := m.AppendWire(nil)
	label := st.s.m.label(HealthInfoType)
	st.s.m.requests.WithLabelValues(label).Inc()
	st.s.m.requestBytes.WithLabelValues(label).Add(float64(len(b)))
	st.q.push(bytesFrame(b))
}
