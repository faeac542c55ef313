package sds

import (
	"sort"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

// DeltaSecrets is the incremental stream: clients subscribe and unsubscribe by name
// and get only the resources whose version changed since they last got them.
func (s *Server) DeltaSecrets(stream secretv3.SecretDiscoveryService_DeltaSecretsServer) error {
	s.obs.Stream("delta", 1)
	defer s.obs.Stream("delta", -1)
	ctx := stream.Context()
	reqs := make(chan *discoveryv3.DeltaDiscoveryRequest)
	errc := make(chan error, 1)
	go recvLoop(ctx, stream.Recv, reqs, errc)

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
		resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: sdsclient.SecretTypeURL, Nonce: s.nextNonce(), SystemVersionInfo: versionOf(changed)}
		for _, e := range changed {
			resp.Resources = append(resp.Resources, &discoveryv3.Resource{Name: e.Name, Version: e.Version, Resource: e.Any})
		}
		if err := stream.Send(resp); err != nil {
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
				if node = req.GetNode().GetId(); node == "" {
					return status.Error(codes.InvalidArgument, "node id required on the first request")
				}
				for n, v := range req.GetInitialResourceVersions() {
					sent[n] = v // the client already holds these: resend only on change
				}
			}
			if err := checkType(req.GetTypeUrl()); err != nil {
				return err
			}
			if nonce := req.GetResponseNonce(); nonce != "" {
				if d := req.GetErrorDetail(); d != nil {
					if names, ok := nonces[nonce]; ok {
						s.log.Warn("secret nacked", "node", node, "names", names, "nonce", nonce, "error", d.GetMessage())
						s.obs.Nacked(node, names, "", nonce, d.GetMessage())
					}
				}
			}
			if err := s.checkNames(req.GetResourceNamesSubscribe()); err != nil {
				return err
			}
			for _, n := range req.GetResourceNamesSubscribe() {
				subs[n] = true
			}
			for _, n := range req.GetResourceNamesUnsubscribe() {
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
