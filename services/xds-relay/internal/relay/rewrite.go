package relay

import (
	"context"
	"fmt"
	"sync"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/meshagent/meshagent/pkg/xdswire"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Rewriter changes the resources of one type URL before Envoy sees them (Istio's
// agent does so for ECDS: pkg/wasm). Rewrite replaces entries of resources in
// place; an error rejects the response, which the relay then NACKs upstream and
// does not forward. Responses of a rewritten type are decoded whole, the rest
// still pass as raw bytes.
type Rewriter interface {
	TypeURL() string
	Rewrite(ctx context.Context, resources []*anypb.Any) error
}

// versions is the last version Envoy reported per rewritten type: a NACK of
// the relay's own carries it, as Istio's agent NACKs ECDS with Envoy's last
// ACKed version rather than the rejected one.
type versions struct {
	mu sync.Mutex
	v  map[string]string
}

func (vs *versions) set(t, v string) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if vs.v == nil {
		vs.v = map[string]string{}
	}
	vs.v[t] = v
}

func (vs *versions) get(t string) string {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	return vs.v[t]
}

// envoyVersion records the version of Envoy's request h for a rewritten type.
func (st *stream) envoyVersion(h header) {
	if _, ok := st.s.rewriters[string(h.TypeURL)]; ok && len(h.Version) > 0 {
		st.versions.set(string(h.TypeURL), string(h.Version))
	}
}

// rewrite returns the frame to forward for response f (f itself when nothing
// changed, else a new encoding), or nil when rw rejected it: then it has queued
// the NACK upstream. The caller frees f.
func (st *stream) rewrite(ctx context.Context, rw Rewriter, h header, f *frame) (*frame, error) {
	var (
		msg proto.Message
		res []*anypb.Any
		put func([]*anypb.Any)
	)
	switch st.mode.name {
	case sotw.name:
		r := &discoveryv3.DiscoveryResponse{}
		msg, put = r, func(a []*anypb.Any) { r.Resources = a }
		if err := proto.Unmarshal(f.bytes(), r); err != nil {
			return nil, upstreamErr{fmt.Errorf("bad response: %w", err)}
		}
		res = r.GetResources()
	default:
		r := &discoveryv3.DeltaDiscoveryResponse{}
		msg = r
		if err := proto.Unmarshal(f.bytes(), r); err != nil {
			return nil, upstreamErr{fmt.Errorf("bad response: %w", err)}
		}
		for _, x := range r.GetResources() {
			res = append(res, x.GetResource())
		}
		put = func(a []*anypb.Any) {
			for i, x := range r.GetResources() {
				x.Resource = a[i]
			}
		}
	}
	before := append([]*anypb.Any(nil), res...)
	if err := rw.Rewrite(ctx, res); err != nil {
		label := st.respSeries.of(h.TypeURL).label
		st.s.log.Warn("rejecting config for envoy", "stream", st.id, "type", string(h.TypeURL), "nonce", string(h.Nonce), "error", err)
		st.s.m.nacks.WithLabelValues(label).Inc()
		nack := h
		nack.Version = []byte(st.versions.get(string(h.TypeURL)))
		st.send(st.respSeries, st.mode.reply(nack, &xdswire.Status{Code: int32(codes.Internal), Message: err.Error()}))
		return nil, nil
	}
	changed := false
	for i := range res {
		changed = changed || res[i] != before[i]
	}
	if !changed {
		return f, nil
	}
	put(res)
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("encode rewritten %s: %w", h.TypeURL, err)
	}
	return bytesFrame(b), nil
}
