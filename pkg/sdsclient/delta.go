package sdsclient

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/meshagent/meshagent/pkg/xdswire"
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
	stream grpc.ClientStream
	cancel context.CancelFunc
	mu     sync.Mutex
	node   string
	first  bool
}

// OpenDelta starts a DeltaSecrets stream subscribed to names.
func OpenDelta(ctx context.Context, cc grpc.ClientConnInterface, nodeID string, names ...string) (*DeltaStream, error) {
	if nodeID == "" {
		return nil, errors.New("sdsclient: empty node id")
	}
	ctx, cancel := context.WithCancel(ctx)
	st, err := openStream(ctx, cc, "DeltaSecrets", methodDelta)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("open delta stream: %w", err)
	}
	d := &DeltaStream{stream: st, cancel: cancel, node: nodeID, first: true}
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
	req := &xdswire.DeltaDiscoveryRequest{TypeURL: SecretTypeURL, Subscribe: add, Unsubscribe: remove}
	if d.first {
		req.NodeID, d.first = d.node, false
	}
	return d.stream.SendMsg(req)
}

// RecvRaw returns the next response without acknowledging it.
func (d *DeltaStream) RecvRaw() (*xdswire.DeltaDiscoveryResponse, error) {
	resp := &xdswire.DeltaDiscoveryResponse{}
	if err := d.stream.RecvMsg(resp); err != nil {
		return nil, err
	}
	return resp, nil
}

// Recv returns the next response, decoded, and ACKs it (NACKs it if it does not decode).
func (d *DeltaStream) Recv() (DeltaUpdate, error) {
	resp, err := d.RecvRaw()
	if err != nil {
		return DeltaUpdate{}, err
	}
	u := DeltaUpdate{Nonce: resp.Nonce, Versions: map[string]string{}, Secrets: map[string]Secret{}, Removed: resp.RemovedResources}
	for _, r := range resp.Resources {
		var a xdswire.Any
		if r.Resource != nil {
			a = *r.Resource
		}
		s, err := xdswire.DecodeSecret(a)
		if err != nil {
			return DeltaUpdate{}, errors.Join(err, d.Nack(resp, err.Error()))
		}
		u.Secrets[r.Name] = s
		u.Versions[r.Name] = r.Version
	}
	return u, d.Ack(resp)
}

// Ack accepts resp.
func (d *DeltaStream) Ack(resp *xdswire.DeltaDiscoveryResponse) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stream.SendMsg(&xdswire.DeltaDiscoveryRequest{TypeURL: SecretTypeURL, ResponseNonce: resp.Nonce})
}

// Nack rejects resp with msg.
func (d *DeltaStream) Nack(resp *xdswire.DeltaDiscoveryResponse, msg string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stream.SendMsg(&xdswire.DeltaDiscoveryRequest{TypeURL: SecretTypeURL, ResponseNonce: resp.Nonce,
		ErrorDetail: &xdswire.Status{Code: int32(codes.InvalidArgument), Message: msg}})
}

// Close ends the stream.
func (d *DeltaStream) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.stream.CloseSend()
	d.cancel()
	return err
}
