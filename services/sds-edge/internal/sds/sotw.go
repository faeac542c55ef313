package sds

import (
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/pkg/xdswire"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// StreamSecrets is the state-of-the-world stream Envoy opens per SDS secret.
//
// A response carries every watched resource that has a value. A request whose nonce
// is not the last one sent is stale and ignored; one with error_detail is a NACK: it
// is reported and nothing is resent until the resource changes again.
func (s *Server) StreamSecrets(stream grpc.ServerStream) error {
	return serveStream(s, "stream", stream, func(w *secrets.Watch) streamHandler[*xdswire.DiscoveryRequest] {
		return &sotwStream{s: s, stream: stream, w: w, sent: map[string]string{}}
	})
}

// sotwStream is one state-of-the-world stream's state.
type sotwStream struct {
	s         *Server
	stream    grpc.ServerStream
	w         *secrets.Watch
	node      string
	names     []string
	sent      map[string]string // name -> version last sent
	lastNonce string
	lastVer   string
}

func (st *sotwStream) changed() error { return st.send(false) }

// send sends every watched resource if any changed since it was last sent;
// served says the client asked for them (rather than a push).
func (st *sotwStream) send(served bool) error {
	entries := st.s.store.Snapshot(st.names)
	changed := false
	for _, e := range entries {
		if st.sent[e.Name] != e.Version {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	resp := &xdswire.DiscoveryResponse{TypeURL: sdsclient.SecretTypeURL, VersionInfo: versionOf(entries),
		Resources: anys(entries), Nonce: st.s.nextNonce()}
	if err := st.stream.SendMsg(resp); err != nil {
		return err
	}
	for _, e := range entries {
		if st.sent[e.Name] != e.Version && served {
			st.s.obs.Served(st.node, e)
		}
		st.sent[e.Name] = e.Version
	}
	st.lastNonce, st.lastVer = resp.Nonce, resp.VersionInfo
	return nil
}

func (st *sotwStream) request(req *xdswire.DiscoveryRequest) error {
	if st.node == "" {
		if st.node = req.NodeID; st.node == "" {
			return status.Error(codes.InvalidArgument, "node id required on the first request")
		}
	}
	if err := checkType(req.TypeURL); err != nil {
		return err
	}
	if nonce := req.ResponseNonce; nonce != "" {
		if nonce != st.lastNonce {
			return nil // stale: an answer to a response we have since replaced
		}
		if d := req.ErrorDetail; d != nil {
			st.s.log.Warn("secret nacked", "node", st.node, "names", st.names, "version", st.lastVer, "nonce", nonce, "error", d.Message)
			st.s.obs.Nacked(st.node, st.names, st.lastVer, nonce, d.Message)
			return nil
		}
	}
	if !slices.Equal(req.ResourceNames, st.names) {
		if err := st.s.checkNames(req.ResourceNames); err != nil {
			return err
		}
		st.names = slices.Clone(req.ResourceNames)
		st.s.obs.Asked(st.node, st.names)
		for n := range st.sent {
			if !slices.Contains(st.names, n) {
				delete(st.sent, n)
			}
		}
		st.w.Set(st.names)
	}
	return st.send(true)
}
