package sds

import (
	"sort"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/pkg/xdswire"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// DeltaSecrets is the incremental stream: clients subscribe and unsubscribe by name
// and get only the resources whose version changed since they last got them.
func (s *Server) DeltaSecrets(stream grpc.ServerStream) error {
	return serveStream(s, "delta", stream, func(w *secrets.Watch) streamHandler[*xdswire.DeltaDiscoveryRequest] {
		return &deltaStream{s: s, stream: stream, w: w, subs: map[string]bool{}, sent: map[string]string{}, nonces: map[string][]string{}}
	})
}

// deltaStream is one incremental stream's state.
type deltaStream struct {
	s      *Server
	stream grpc.ServerStream
	w      *secrets.Watch
	node   string
	subs   map[string]bool
	sent   map[string]string   // name -> version the client holds
	nonces map[string][]string // nonce -> names it carried
}

// subscribed is the names the client subscribes to, sorted.
func (st *deltaStream) subscribed() []string {
	names := make([]string, 0, len(st.subs))
	for n := range st.subs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (st *deltaStream) changed() error { return st.send(false) }

// send sends the subscribed resources whose version the client does not hold;
// served says the client asked for them (rather than a push).
func (st *deltaStream) send(served bool) error {
	var changed []*secrets.Entry
	for _, e := range st.s.store.Snapshot(st.subscribed()) {
		if st.sent[e.Name] != e.Version {
			changed = append(changed, e)
		}
	}
	if len(changed) == 0 {
		return nil
	}
	resp := &xdswire.DeltaDiscoveryResponse{TypeURL: sdsclient.SecretTypeURL, Nonce: st.s.nextNonce(), SystemVersionInfo: versionOf(changed)}
	for _, e := range changed {
		resp.Resources = append(resp.Resources, xdswire.Resource{Name: e.Name, Version: e.Version, Resource: &e.Any})
	}
	if err := st.stream.SendMsg(resp); err != nil {
		return err
	}
	var sentNames []string
	for _, e := range changed {
		if served {
			st.s.obs.Served(st.node, e)
		}
		st.sent[e.Name] = e.Version
		sentNames = append(sentNames, e.Name)
	}
	clear(st.nonces) // only the newest response can be (N)ACKed meaningfully
	st.nonces[resp.Nonce] = sentNames
	return nil
}

func (st *deltaStream) request(req *xdswire.DeltaDiscoveryRequest) error {
	if st.node == "" {
		if st.node = req.NodeID; st.node == "" {
			return status.Error(codes.InvalidArgument, "node id required on the first request")
		}
		for n, v := range req.InitialResourceVersions {
			st.sent[n] = v // the client already holds these: resend only on change
		}
	}
	if err := checkType(req.TypeURL); err != nil {
		return err
	}
	if nonce := req.ResponseNonce; nonce != "" {
		if d := req.ErrorDetail; d != nil {
			if names, ok := st.nonces[nonce]; ok {
				st.s.log.Warn("secret nacked", "node", st.node, "names", names, "nonce", nonce, "error", d.Message)
				st.s.obs.Nacked(st.node, names, "", nonce, d.Message)
			}
		}
	}
	if err := st.s.checkNames(req.Subscribe); err != nil {
		return err
	}
	for _, n := range req.Subscribe {
		st.subs[n] = true
	}
	if len(req.Subscribe) > 0 {
		st.s.obs.Asked(st.node, req.Subscribe)
	}
	for _, n := range req.Unsubscribe {
		delete(st.subs, n)
		delete(st.sent, n)
	}
	st.w.Set(st.subscribed())
	return st.send(true)
}
