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
	s.obs.Stream("delta", 1)
	defer s.obs.Stream("delta", -1)
	ctx := stream.Context()
	reqs := make(chan *xdswire.DeltaDiscoveryRequest)
	errc := make(chan error, 1)
	go recvLoop(ctx, stream, reqs, errc)

	w := s.store.NewWatch()
	defer w.Close()
	var (
		node   string
		subs   = map[string]bool{}
		sent   = map[string]string{}   // name -> version the client holds
		nonces = map[string][]string{} // nonce -> names it carried
	)
	send := func(served bool) error {
		names := make([]string, 0, len(subs))
		for n := range subs {
			names = append(names, n)
		}
		sort.Strings(names)
		var changed []*secrets.Entry
		for _, e := range s.store.Snapshot(names) {
			if sent[e.Name] != e.Version {
				changed = append(changed, e)
			}
		}
		if len(changed) == 0 {
			return nil
		}
		resp := &xdswire.DeltaDiscoveryResponse{TypeURL: sdsclient.SecretTypeURL, Nonce: s.nextNonce(), SystemVersionInfo: versionOf(changed)}
		for _, e := range changed {
			resp.Resources = append(resp.Resources, xdswire.Resource{Name: e.Name, Version: e.Version, Resource: &e.Any})
		}
		if err := stream.SendMsg(resp); err != nil {
			return err
		}
		var sentNames []string
		for _, e := range changed {
			if served {
				s.obs.Served(node, e)
			}
			sent[e.Name] = e.Version
			sentNames = append(sentNames, e.Name)
		}
		clear(nonces) // only the newest response can be (N)ACKed meaningfully
		nonces[resp.Nonce] = sentNames
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return streamEnd(err)
		case <-w.C():
			if err := send(false); err != nil {
				return err
			}
		case req := <-reqs:
			if node == "" {
				if node = req.NodeID; node == "" {
					return status.Error(codes.InvalidArgument, "node id required on the first request")
				}
				for n, v := range req.InitialResourceVersions {
					sent[n] = v // the client already holds these: resend only on change
				}
			}
			if err := checkType(req.TypeURL); err != nil {
				return err
			}
			if nonce := req.ResponseNonce; nonce != "" {
				if d := req.ErrorDetail; d != nil {
					if names, ok := nonces[nonce]; ok {
						s.log.Warn("secret nacked", "node", node, "names", names, "nonce", nonce, "error", d.Message)
						s.obs.Nacked(node, names, "", nonce, d.Message)
					}
				}
			}
			if err := s.checkNames(req.Subscribe); err != nil {
				return err
			}
			for _, n := range req.Subscribe {
				subs[n] = true
			}
			if len(req.Subscribe) > 0 {
				s.obs.Asked(node, req.Subscribe)
			}
			for _, n := range req.Unsubscribe {
				delete(subs, n)
				delete(sent, n)
			}
			names := make([]string, 0, len(subs))
			for n := range subs {
				names = append(names, n)
			}
			w.Set(names)
			if err := send(true); err != nil {
				return err
			}
		}
	}
}
