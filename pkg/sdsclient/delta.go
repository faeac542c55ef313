package sdsclient

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// DeltaUpdate is one decoded DeltaSecrets response.
type DeltaUpdate struct {
	Nonce    string
	Versions map[string]string // resource version per name
	Secrets  map[string]Secret
	Removed  []string
}

// DeltaStream is one incremental DeltaSecrets stream.
type DeltaStream struct {
	stream secretv3.SecretDiscoveryService_DeltaSecretsClient
	cancel context.CancelFunc
	mu     sync.Mutex
	node   *corev3.Node
	first  bool
}

// OpenDelta starts a DeltaSecrets stream subscribed to names.
func OpenDelta(ctx context.Context, cc grpc.ClientConnInterface, nodeID string, names ...string) (*DeltaStream, error) {
	if nodeID == "" {
		return nil, errors.New("sdsclient: empty node id")
	}
	ctx, cancel := context.WithCancel(ctx)
	st, err := secretv3.NewSecretDiscoveryServiceClient(cc).DeltaSecrets(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("open delta stream: %w", err)
	}
	d := &DeltaStream{stream: st, cancel: cancel, node: &corev3.Node{Id: nodeID}, first: true}
	if err := d.Subscribe(names, nil); err != nil {
		cancel()
		return nil, err
	}
	return d, nil
}

// Subscribe adds and removes names.
func (d *DeltaStream) Subscribe(add, remove []string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: SecretTypeURL, ResourceNamesSubscribe: add, ResourceNamesUnsubscribe: remove}
	if d.first {
		req.Node, d.first = d.node, false
	}
	return d.stream.Send(req)
}

// RecvRaw returns the next response without acknowledging it.
func (d *DeltaStream) RecvRaw() (*discoveryv3.DeltaDiscoveryResponse, error) { return d.stream.Recv() }

// Recv returns the next response, decoded, and ACKs it (NACKs it if it does not decode).
func (d *DeltaStream) Recv() (DeltaUpdate, error) {
	resp, err := d.stream.Recv()
	if err != nil {
		return DeltaUpdate{}, err
	}
	u := DeltaUpdate{Nonce: resp.GetNonce(), Versions: map[string]string{}, Secrets: map[string]Secret{}, Removed: resp.GetRemovedResources()}
	for _, r := range resp.GetResources() {
		s, err := DecodeSecret(r.GetResource())
		if err != nil {
			return DeltaUpdate{}, errors.Join(err, d.Nack(resp, err.Error()))
		}
		u.Secrets[r.GetName()] = s
		u.Versions[r.GetName()] = r.GetVersion()
	}
	return u, d.Ack(resp)
}

// Ack accepts resp.
func (d *DeltaStream) Ack(resp *discoveryv3.DeltaDiscoveryResponse) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: SecretTypeURL, ResponseNonce: resp.GetNonce()})
}

// Nack rejects resp with msg.
func (d *DeltaStream) Nack(resp *discoveryv3.DeltaDiscoveryResponse, msg string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: SecretTypeURL, ResponseNonce: resp.GetNonce(),
		ErrorDetail: &statuspb.Status{Code: int32(codes.InvalidArgument), Message: msg}})
}

// Close ends the stream.
func (d *DeltaStream) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.stream.CloseSend()
	d.cancel()
	return err
}
