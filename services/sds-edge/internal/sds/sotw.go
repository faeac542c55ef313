package sds

import (
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/pkg/xdswire"
)

// StreamSecrets is the state-of-the-world stream Envoy opens per SDS secret.
//
// A response carries every watched resource that has a value. A request whose nonce
// is not the last one sent is stale and ignored; one with error_detail is a NACK: it
// is reported and nothing is resent until the resource changes again.
func (s *Server) StreamSecrets(stream grpc.ServerStream) error {
	s.obs.Stream("stream", 1)
	defer s.obs.Stream("stream", -1)
	ctx := stream.Context()
	reqs := make(chan *xdswire.DiscoveryRequest)
	errc := make(chan error, 1)
	go recvLoop(ctx, stream, reqs, errc)

	w := s.store.NewWatch()
	defer w.Close()
	var (
		node      string
		names     []string
		sent      = map[string]string{} // name -> version last sent
		lastNonce string
		lastVer   string
	)
	send := func(served bool) error {
		entries := s.store.Snapshot(names)
		changed := false
		for _, e := range entries {
			if sent[e.Name] != e.Version {
				changed = true
			}
		}
		if !changed {
			return nil
		}
		resp := &xdswire.DiscoveryResponse{TypeURL: sdsclient.SecretTypeURL, VersionInfo: versionOf(entries),
			Resources: anys(entries), Nonce: s.nextNonce()}
		if err := stream.SendMsg(resp); err != nil {
			return err
		}
		for _, e := range entries {
			if sent[e.Name] != e.Version && served {
				s.obs.Served(node, e)
			}
			sent[e.Name] = e.Version
		}
		lastNonce, lastVer = resp.Nonce, resp.VersionInfo
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
			}
			if err := checkType(req.TypeURL); err != nil {
				return err
			}
			if nonce := req.ResponseNonce; nonce != "" {
				if nonce != lastNonce {
					continue // stale: an answer to a response we have since replaced
				}
				if d := req.ErrorDetail; d != nil {
					s.log.Warn("secret nacked", "node", node, "names", names, "version", lastVer, "nonce", nonce, "error", d.Message)
					s.obs.Nacked(node, names, lastVer, nonce, d.Message)
					continue
				}
			}
			if !slices.Equal(req.ResourceNames, names) {
				if err := s.checkNames(req.ResourceNames); err != nil {
					return err
				}
				names = slices.Clone(req.ResourceNames)
				s.obs.Asked(node, names)
				for n := range sent {
					if !slices.Contains(names, n) {
						delete(sent, n)
					}
				}
				w.Set(names)
			}
			if err := send(true); err != nil {
				return err
			}
		}
	}
}
