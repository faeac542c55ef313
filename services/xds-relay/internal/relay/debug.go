package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/meshagent/meshagent/pkg/xdswire"
)

// DebugTypePrefix starts the type URLs of istiod's debug answers (istio.io/debug/syncz,
// istio.io/debug/config_dump): the agent asks for them on Envoy's ADS stream, as
// Istio's agent did for its debug tap (PROXY_XDS_DEBUG_VIA_AGENT), and their
// responses never reach Envoy.
const DebugTypePrefix = "istio.io/debug/"

// Errors of Debug, for the tap to map to its answer.
var (
	// ErrNoStream: no Envoy ADS stream is open, so there is no stream to ask on
	// (Istio's agent: "proxy not connected to Istiod").
	ErrNoStream = errors.New("no ADS stream to the discovery server: Envoy is not connected")
	// ErrStreamEnded: the stream asked on ended before the answer came.
	ErrStreamEnded = errors.New("the ADS stream ended before the discovery server answered")
	// ErrNotDebugType: the type URL is not one of istio.io/debug/<name>.
	ErrNotDebugType = errors.New("not a debug type")
)

// IsDebugType reports whether typeURL is istio.io/debug/<name>. The bare
// istio.io/debug type is not one: istiod answers a refused request of that type
// by ending the whole ADS stream, which would cut the pod's Envoy off.
func IsDebugType(typeURL string) bool {
	name, ok := strings.CutPrefix(typeURL, DebugTypePrefix)
	return ok && name != ""
}

// Debug asks the discovery server for typeURL (istio.io/debug/<name>) with the
// given resource names on the newest open Envoy stream, and returns its answer,
// as a state-of-the-world response whatever the stream's mode. One question is in
// flight at a time (as in Istio's agent): the answer is matched by its type URL.
// It returns ctx's error when ctx ends first.
func (s *Server) Debug(ctx context.Context, typeURL string, names []string) (*xdswire.DiscoveryResponse, error) {
	if !IsDebugType(typeURL) {
		return nil, fmt.Errorf("%w: %q: want %s<name>", ErrNotDebugType, typeURL, DebugTypePrefix)
	}
	select {
	case s.debugTurn <- struct{}{}:
		defer func() { <-s.debugTurn }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	st := s.newestStream()
	if st == nil {
		return nil, ErrNoStream
	}
	answer := make(chan *xdswire.DiscoveryResponse, 1)
	st.awaitDebug(typeURL, answer)
	defer st.awaitDebug("", nil)
	b := st.mode.debugRequest(typeURL, names).AppendWire(nil)
	label := s.m.label(typeURL)
	s.m.requests.WithLabelValues(label).Inc()
	s.m.requestBytes.WithLabelValues(label).Add(float64(len(b)))
	st.q.push(bytesFrame(b))
	select {
	case r := <-answer:
		return r, nil
	case <-st.ctx.Done():
		return nil, ErrStreamEnded
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// awaitDebug sets the question the stream's next debug answer of typeURL goes
// to (nil: none), before the question is sent so that no answer can miss it.
func (st *stream) awaitDebug(typeURL string, answer chan *xdswire.DiscoveryResponse) {
	st.debugMu.Lock()
	defer st.debugMu.Unlock()
	st.debugType, st.debugAnswer = typeURL, answer
}

// deliverDebug hands a debug response to the question waiting for it, or drops
// it when none is: its question timed out, and a late answer to an earlier
// question is matched by type URL and so not taken for a later one's.
func (st *stream) deliverDebug(f *frame) {
	r, err := st.mode.debugResponse(f.data.Materialize())
	if err != nil {
		st.s.log.Warn("dropping a bad debug response", "stream", st.id, "error", err)
		return
	}
	st.debugMu.Lock()
	answer := st.debugAnswer
	if answer == nil || r.TypeURL != st.debugType {
		st.debugMu.Unlock()
		st.s.log.Info("debug response arrived with no question waiting; dropped", "stream", st.id, "type", r.TypeURL)
		return
	}
	st.debugAnswer = nil
	st.debugMu.Unlock()
	answer <- r // buffered, and taken once
}

// register makes st a stream Debug may ask on once queue (which queues its
// first requests) has run: Debug, which takes the same lock, neither asks before
// Envoy's first request (istiod learns the node from it) nor misses a stream
// whose first request was answered.
func (s *Server) register(st *stream, queue func()) {
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	queue()
	s.live = append(s.live, st)
}

func (s *Server) unregister(st *stream) {
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	for i, l := range s.live {
		if l == st {
			s.live = append(s.live[:i], s.live[i+1:]...)
			return
		}
	}
}

// newestStream is the stream Envoy opened last (Istio's agent keeps one: the newest).
func (s *Server) newestStream() *stream {
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	if len(s.live) == 0 {
		return nil
	}
	return s.live[len(s.live)-1]
}

func sotwDebugRequest(typeURL string, names []string) xdswire.Message {
	return &xdswire.DiscoveryRequest{TypeURL: typeURL, ResourceNames: names}
}

func deltaDebugRequest(typeURL string, names []string) xdswire.Message {
	return &xdswire.DeltaDiscoveryRequest{TypeURL: typeURL, Subscribe: names}
}

func sotwDebugResponse(b []byte) (*xdswire.DiscoveryResponse, error) {
	var r xdswire.DiscoveryResponse
	if err := r.UnmarshalWire(b); err != nil {
		return nil, err
	}
	return &r, nil
}

// deltaDebugResponse reads a delta answer as the state-of-the-world one the tap
// returns: the same resources, version and nonce.
func deltaDebugResponse(b []byte) (*xdswire.DiscoveryResponse, error) {
	var d xdswire.DeltaDiscoveryResponse
	if err := d.UnmarshalWire(b); err != nil {
		return nil, err
	}
	r := &xdswire.DiscoveryResponse{VersionInfo: d.SystemVersionInfo, TypeURL: d.TypeURL, Nonce: d.Nonce}
	for _, res := range d.Resources {
		if res.Resource != nil {
			r.Resources = append(r.Resources, *res.Resource)
		}
	}
	return r, nil
}
