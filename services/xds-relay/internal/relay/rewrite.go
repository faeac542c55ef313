package relay

import (
	"context"
	"fmt"
	"sync"

	"github.com/meshagent/meshagent/pkg/xdswire"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"
)

// Rewriter changes the resources of one type URL before Envoy sees them (Istio's
// agent does so for ECDS: pkg/wasm). Rewrite replaces entries of resources in
// place; an error rejects the response, which the relay then NACKs upstream and
// does not forward. Responses of a rewritten type are read for their resources,
// the rest still pass as raw bytes.
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
// the NACK upstream. The caller frees f. The response is read with xdswire and
// re-encoded field by field: only the resources rw replaced change, every other
// field keeps its bytes.
func (st *stream) rewrite(ctx context.Context, rw Rewriter, h header, f *frame) (*frame, error) {
	res, err := responseResources(st.mode.name == sotw.name, f.bytes())
	if err != nil {
		return nil, upstreamErr{fmt.Errorf("bad response: %w", err)}
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
	b, err := replaceResources(st.mode.name == sotw.name, f.bytes(), res, before)
	if err != nil {
		return nil, fmt.Errorf("encode rewritten %s: %w", h.TypeURL, err)
	}
	return bytesFrame(b), nil
}

// responseResources are the resources of the DiscoveryResponse (sotw) or
// DeltaDiscoveryResponse b, in order; a delta resource without a body is nil.
// Their values are copies: b is a frame the caller frees.
func responseResources(sotw bool, b []byte) ([]*anypb.Any, error) {
	var res []*anypb.Any
	pb := func(a *xdswire.Any) *anypb.Any {
		if a == nil {
			return nil
		}
		return &anypb.Any{TypeUrl: a.TypeURL, Value: append([]byte(nil), a.Value...)}
	}
	if sotw {
		var r xdswire.DiscoveryResponse
		if err := r.UnmarshalWire(b); err != nil {
			return nil, err
		}
		for i := range r.Resources {
			res = append(res, pb(&r.Resources[i]))
		}
		return res, nil
	}
	var r xdswire.DeltaDiscoveryResponse
	if err := r.UnmarshalWire(b); err != nil {
		return nil, err
	}
	for _, x := range r.Resources {
		res = append(res, pb(x.Resource))
	}
	return res, nil
}

// replaceResources is the response b with its i-th resource res[i] wherever
// that is not before[i]; every other field is copied as it came.
func replaceResources(sotw bool, b []byte, res, before []*anypb.Any) ([]byte, error) {
	var out []byte
	i := 0
	err := xdswire.Fields(b, func(f xdswire.Field) error {
		if !f.Is(2, protowire.BytesType) { // resources, in both
			out = append(out, f.Raw...)
			return nil
		}
		n := i
		i++
		if res[n] == before[n] {
			out = append(out, f.Raw...)
			return nil
		}
		a := xdswire.Any{TypeURL: res[n].GetTypeUrl(), Value: res[n].GetValue()}
		if sotw {
			out = xdswire.AppendAny(out, 2, a)
			return nil
		}
		rest, _, _, err := xdswire.Split(f.Bytes, 2) // the Resource but its body
		out = xdswire.AppendBytes(out, 2, xdswire.AppendAny(rest, 2, a))
		return err
	})
	return out, err
}
