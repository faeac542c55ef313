package sdsclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshagent/meshagent/pkg/xdswire"
)

// DialUnix returns a client connection to the SDS server on the unix socket at path.
// Like grpc.NewClient it does not connect until first use.
func DialUnix(ctx context.Context, path string) (*grpc.ClientConn, error) {
	if path == "" {
		return nil, errors.New("sdsclient: empty socket path")
	}
	return grpc.NewClient("passthrough:///"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}),
	)
}

// Update is one decoded StreamSecrets response.
type Update struct {
	Version, Nonce string
	Secrets        map[string]Secret
}

// Decode decodes every resource of resp.
func Decode(resp *xdswire.DiscoveryResponse) (Update, error) {
	u := Update{Version: resp.VersionInfo, Nonce: resp.Nonce, Secrets: make(map[string]Secret, len(resp.Resources))}
	if resp.TypeURL != SecretTypeURL {
		return u, fmt.Errorf("response type %q: want %q", resp.TypeURL, SecretTypeURL)
	}
	for _, r := range resp.Resources {
		s, err := xdswire.DecodeSecret(r)
		if err != nil {
			return u, err
		}
		u.Secrets[s.Name] = s
	}
	return u, nil
}

// Stream is one state-of-the-world StreamSecrets stream. Recv and RecvRaw must not be
// called concurrently; Ack, Nack and Close may be called from any goroutine.
type Stream struct {
	stream grpc.ClientStream
	cancel context.CancelFunc
	node   string
	names  []string
	mu     sync.Mutex // serialises Send and guards acked
	acked  string     // version last accepted
	closed bool
}

// Open starts a StreamSecrets stream for names as node nodeID and sends the first
// request. The stream lives until ctx ends or Close is called.
func Open(ctx context.Context, cc grpc.ClientConnInterface, nodeID string, names ...string) (*Stream, error) {
	if nodeID == "" {
		return nil, errors.New("sdsclient: empty node id")
	}
	ctx, cancel := context.WithCancel(ctx)
	st, err := openStream(ctx, cc, "StreamSecrets", methodStream)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("open stream: %w", err)
	}
	s := &Stream{stream: st, cancel: cancel, node: nodeID, names: append([]string(nil), names...)}
	if err := st.SendMsg(&xdswire.DiscoveryRequest{NodeID: s.node, TypeURL: SecretTypeURL, ResourceNames: s.names}); err != nil {
		cancel()
		return nil, fmt.Errorf("send first request: %w", err)
	}
	return s, nil
}

// RecvRaw returns the next response without acknowledging it: the caller must Ack or
// Nack it (as Envoy would) before the server sends anything else for the same names.
func (s *Stream) RecvRaw() (*xdswire.DiscoveryResponse, error) {
	resp := &xdswire.DiscoveryResponse{}
	if err := s.stream.RecvMsg(resp); err != nil {
		return nil, err
	}
	return resp, nil
}

// Recv returns the next response, decoded, and ACKs it. A response that does not
// decode is NACKed and returned as an error.
func (s *Stream) Recv() (Update, error) {
	resp, err := s.RecvRaw()
	if err != nil {
		return Update{}, err
	}
	u, err := Decode(resp)
	if err != nil {
		if nerr := s.Nack(resp, err.Error()); nerr != nil {
			return Update{}, errors.Join(err, nerr)
		}
		return Update{}, err
	}
	if err := s.Ack(resp); err != nil {
		return Update{}, err
	}
	return u, nil
}

// Ack accepts resp: the next request carries its version and nonce.
func (s *Stream) Ack(resp *xdswire.DiscoveryResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acked = resp.VersionInfo
	return s.send(&xdswire.DiscoveryRequest{NodeID: s.node, TypeURL: SecretTypeURL, ResourceNames: s.names,
		VersionInfo: s.acked, ResponseNonce: resp.Nonce})
}

// Nack rejects resp with msg: the next request carries the last accepted version,
// resp's nonce and an error detail.
func (s *Stream) Nack(resp *xdswire.DiscoveryResponse, msg string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.send(&xdswire.DiscoveryRequest{NodeID: s.node, TypeURL: SecretTypeURL, ResourceNames: s.names,
		VersionInfo: s.acked, ResponseNonce: resp.Nonce,
		ErrorDetail: &xdswire.Status{Code: int32(codes.InvalidArgument), Message: msg}})
}

// Subscribe changes the names the stream watches (an Envoy resubscription), keeping
// the last accepted version.
func (s *Stream) Subscribe(names ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.names = append([]string(nil), names...)
	return s.send(&xdswire.DiscoveryRequest{NodeID: s.node, TypeURL: SecretTypeURL, ResourceNames: s.names, VersionInfo: s.acked})
}

func (s *Stream) send(req *xdswire.DiscoveryRequest) error {
	if s.closed {
		return errors.New("sdsclient: stream closed")
	}
	if err := s.stream.SendMsg(req); err != nil {
		return fmt.Errorf("send request: %w", err)
	}
	return nil
}

// Close ends the stream.
func (s *Stream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.stream.CloseSend()
	s.cancel()
	return err
}

// Fetch asks for names once with FetchSecrets and returns the decoded secrets.
func Fetch(ctx context.Context, cc grpc.ClientConnInterface, nodeID string, names ...string) (map[string]Secret, error) {
	resp := &xdswire.DiscoveryResponse{}
	err := cc.Invoke(ctx, methodFetch, &xdswire.DiscoveryRequest{NodeID: nodeID, TypeURL: SecretTypeURL, ResourceNames: names},
		resp, grpc.ForceCodecV2(xdswire.Codec{}))
	if err != nil {
		return nil, fmt.Errorf("fetch secrets: %w", err)
	}
	u, err := Decode(resp)
	if err != nil {
		return nil, err
	}
	return u.Secrets, nil
}

// openStream opens one of the service's bidirectional streams with xdswire's codec.
func openStream(ctx context.Context, cc grpc.ClientConnInterface, name, method string) (grpc.ClientStream, error) {
	desc := &grpc.StreamDesc{StreamName: name, ServerStreams: true, ClientStreams: true}
	return cc.NewStream(ctx, desc, method, grpc.ForceCodecV2(xdswire.Codec{}))
}
