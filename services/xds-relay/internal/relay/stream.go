package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/xdswire"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// errDownstreamClosed ends a stream when Envoy goes away.
var errDownstreamClosed = errors.New("downstream closed")

// stream is one relayed ADS stream: Envoy's stream on the socket and its own
// upstream stream.
type stream struct {
	s    *Server
	ctx  context.Context // ends with the stream
	mode mode
	id   string
	ds   grpc.ServerStream
	us   grpc.ClientStream
	q    *queue
	// acked is the last version Envoy ACKed per type URL (fromEnvoy's alone).
	acked map[string]string
	// versions is Envoy's last version of each rewritten type (both loops').
	versions versions
	// Each loop counts with its own cache of series (they are not shared).
	reqSeries, respSeries *streamSeries
	// debugAnswer takes the answer of debugType to the question Debug waits on.
	debugMu     sync.Mutex
	debugType   string
	debugAnswer chan *xdswire.DiscoveryResponse
	// ldsAsked: Envoy has sent its first LDS request, so health reports go on
	// this stream (health.go; guarded by s.liveMu).
	ldsAsked bool
}

// relay runs one downstream stream to its end. An upstream failure ends the
// downstream stream with the upstream's status, so that Envoy restarts its ADS
// sequence on a fresh upstream stream, as with Istio's agent.
func (s *Server) relay(m mode, ds grpc.ServerStream) error {
	id := strconv.FormatUint(s.nextID.Add(1), 10)
	ctx, cancel := context.WithCancelCause(ds.Context())
	defer cancel(nil)
	go func() {
		select {
		case <-s.stop:
			cancel(errors.New("relay shutting down"))
		case <-ctx.Done():
		}
	}()

	cc, md, release, err := s.dial.Dial(ctx)
	if err != nil {
		s.m.upstreamFailures.Inc()
		s.disconnected(id, "upstream dial: "+err.Error())
		return status.Errorf(codes.Unavailable, "xds relay: upstream %s: %v", s.dial.Address(), err)
	}
	defer release()
	us, err := cc.NewStream(metadata.NewOutgoingContext(ctx, md),
		&grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, m.method,
		grpc.ForceCodecV2(codec{}), grpc.MaxCallRecvMsgSize(s.cfg.MaxMsgSize), grpc.MaxCallSendMsgSize(s.cfg.MaxMsgSize))
	if err != nil {
		s.m.upstreamFailures.Inc()
		s.disconnected(id, "upstream stream: "+err.Error())
		return status.Errorf(codes.Unavailable, "xds relay: upstream %s: %v", s.dial.Address(), err)
	}
	st := &stream{s: s, ctx: ctx, mode: m, id: id, ds: ds, us: us, q: newQueue(),
		reqSeries: s.m.forStream(), respSeries: s.m.forStream()}
	defer st.q.close()
	defer s.unregister(st)
	gauge := s.m.streams.WithLabelValues(m.name)
	gauge.Inc()
	defer gauge.Dec()
	s.log.Debug("stream opened", "stream", id, "mode", m.name)

	// Three loops; the first to fail ends the stream. The downstream reader is not
	// waited for: it returns once the handler has returned and gRPC closes the stream.
	errc := make(chan error, 3)
	go func() { errc <- st.fromEnvoy(ctx) }()
	go func() { errc <- st.toUpstream(ctx) }()
	respDone := make(chan error, 1)
	go func() { respDone <- st.fromUpstream(ctx) }()

	var cause error
	select {
	case cause = <-errc:
		cancel(cause)
		<-respDone
	case cause = <-respDone:
		cancel(cause)
	}
	if ds.Context().Err() != nil && !isUpstream(cause) {
		cause = errDownstreamClosed
	}
	return st.finish(cause)
}

// finish maps the cause of the end to the downstream status and reports it.
func (st *stream) finish(cause error) error {
	reason := cause.Error()
	switch {
	case errors.Is(cause, errDownstreamClosed):
		st.s.disconnected(st.id, "downstream closed")
		return nil
	case isUpstream(cause):
		st.s.m.upstreamTerminations.Inc()
		st.s.disconnected(st.id, reason)
		if s, ok := status.FromError(errors.Unwrap(cause)); ok && s.Code() != codes.OK {
			return s.Err()
		}
		return status.Error(codes.Unavailable, "xds relay: "+reason)
	default:
		st.s.disconnected(st.id, reason)
		return status.Error(codes.Unavailable, "xds relay: "+reason)
	}
}

type upstreamErr struct{ err error }

func (e upstreamErr) Error() string { return "upstream: " + e.err.Error() }
func (e upstreamErr) Unwrap() error { return e.err }

func isUpstream(err error) bool { var u upstreamErr; return errors.As(err, &u) }

// fromEnvoy reads Envoy's requests, reports NACKs and queues them for upstream.
// After Envoy's first request (which carries the node) it queues the relay's own
// subscriptions to the agent-consumed types.
func (st *stream) fromEnvoy(ctx context.Context) error {
	first := true
	for {
		f := &frame{}
		if err := st.ds.RecvMsg(f); err != nil {
			if err == io.EOF || status.Code(err) == codes.Canceled {
				return errDownstreamClosed
			}
			return fmt.Errorf("downstream receive: %w", err)
		}
		h, err := parse(f.data, st.mode.req)
		if err != nil {
			f.free()
			return fmt.Errorf("downstream request: %w", err)
		}
		countRequest(st.reqSeries, h.TypeURL, f.data.Len())
		st.envoyVersion(h)
		if h.ErrorDetail != nil {
			st.nack(h)
		} else if len(h.Nonce) > 0 {
			st.ack(h) // before the frame is queued: h aliases it
		}
		lds := string(h.TypeURL) == listenerType // before the frame is queued: h aliases it
		if !first {
			st.q.push(f)
		} else {
			first = false
			st.connected(h) // before the frame is queued: h aliases it
			// The stream becomes one the debug tap may ask on (debug.go).
			st.s.register(st, func() {
				st.q.push(f)
				for t := range st.s.handlers {
					st.send(st.reqSeries, st.mode.subscribe(t))
				}
			})
		}
		if lds {
			st.askedLDS() // the workload's health follows Envoy's LDS request (health.go)
		}
	}
}

// toUpstream sends queued requests upstream in order.
func (st *stream) toUpstream(ctx context.Context) error {
	for {
		f, err := st.q.pop(ctx)
		if err != nil {
			return context.Cause(ctx)
		}
		err = st.us.SendMsg(f)
		f.free() // nothing, unless gRPC failed before taking the buffers
		if err != nil {
			if err == io.EOF {
				// The stream is over; its status surfaces in fromUpstream.
				<-ctx.Done()
				return context.Cause(ctx)
			}
			return upstreamErr{err}
		}
	}
}

// fromUpstream reads responses and hands each to Envoy (or to the agent's
// handler) before reading the next: at most one response is pending, so a slow
// Envoy slows the upstream through gRPC flow control.
func (st *stream) fromUpstream(ctx context.Context) error {
	f := &frame{} // one for every response: each is sent (or freed) before the next
	for {
		if err := st.us.RecvMsg(f); err != nil {
			if err == io.EOF {
				err = errors.New("upstream closed the stream")
			}
			if c := context.Cause(ctx); c != nil {
				return c
			}
			return upstreamErr{err}
		}
		h, err := parse(f.data, st.mode.resp)
		if err != nil {
			f.free()
			return upstreamErr{fmt.Errorf("bad response: %w", err)}
		}
		ts := st.respSeries.of(h.TypeURL)
		ts.responses.Inc()
		ts.responseBytes.Add(float64(f.data.Len()))
		if len(h.TypeURL) > len(DebugTypePrefix) && string(h.TypeURL[:len(DebugTypePrefix)]) == DebugTypePrefix {
			// An answer to the debug tap (Debug), not for Envoy, and never ACKed.
			st.deliverDebug(f)
			f.free()
			continue
		}
		if hd, ok := st.s.handlers[string(h.TypeURL)]; ok {
			err := st.consume(ctx, hd, h, f)
			f.free()
			if err != nil {
				return err
			}
			continue
		}
		out := f
		if rw, ok := st.s.rewriters[string(h.TypeURL)]; ok {
			if out, err = st.rewrite(ctx, rw, h, f); out != f {
				f.free()
			}
			if err != nil {
				return err
			}
			if out == nil {
				continue
			}
		}
		err = st.ds.SendMsg(out)
		out.free()
		if err != nil {
			if c := context.Cause(ctx); c != nil {
				return c
			}
			return fmt.Errorf("downstream send: %w", err)
		}
	}
}

// consume applies an agent-consumed response and ACKs or NACKs it upstream.
func (st *stream) consume(ctx context.Context, hd Handler, h header, f *frame) error {
	label := st.respSeries.of(h.TypeURL).label
	res, err := st.mode.resources(f.bytes())
	if err == nil {
		err = hd.Handle(ctx, res)
	}
	var detail *xdswire.Status
	if err != nil {
		st.s.log.Warn("rejecting agent resource", "stream", st.id, "type", string(h.TypeURL), "nonce", string(h.Nonce), "error", err)
		st.s.m.consumed.WithLabelValues(label, "nack").Inc()
		st.s.m.nacks.WithLabelValues(label).Inc()
		detail = &xdswire.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
	} else {
		st.s.m.consumed.WithLabelValues(label, "ack").Inc()
	}
	st.send(st.respSeries, st.mode.reply(h, detail))
	return nil
}

// send queues a request of the relay's own, counted in the caller's series.
func (st *stream) send(series *streamSeries, m xdswire.Message) {
	b := m.AppendWire(nil)
	f := bytesFrame(b)
	h, _ := parse(f.data, st.mode.req)
	countRequest(series, h.TypeURL, len(b))
	st.q.push(f)
}

func countRequest(series *streamSeries, typeURL []byte, n int) {
	ts := series.of(typeURL)
	ts.requests.Inc()
	ts.requestBytes.Add(float64(n))
}

func (st *stream) connected(h header) {
	node := ""
	if h.Node != nil {
		if id, err := xdswire.DecodeNodeID(h.Node); err == nil {
			node = id
		}
	}
	st.s.log.Info("stream connected", "stream", st.id, "mode", st.mode.name, "node", node)
	st.s.publish(events.PodEventXDSConnected, events.XDSConnected{Pod: st.s.cfg.Pod, Stream: st.id, Mode: st.mode.name,
		Node: node, Upstream: st.s.dial.Address()})
}

func (st *stream) nack(h header) {
	detail := ""
	if s, err := xdswire.DecodeStatus(h.ErrorDetail); err == nil {
		detail = s.Message
	}
	st.s.m.nacks.WithLabelValues(st.reqSeries.of(h.TypeURL).label).Inc()
	st.s.log.Warn("envoy rejected config", "stream", st.id, "type", string(h.TypeURL), "nonce", string(h.Nonce), "version", string(h.Version), "error", detail)
	st.s.publish(events.PodEventXDSNack, events.XDSNack{Pod: st.s.cfg.Pod, Stream: st.id, TypeURL: string(h.TypeURL),
		Nonce: string(h.Nonce), Version: string(h.Version), ErrorDetail: detail})
}

// ack reports a new version Envoy accepted for a type (a request with a nonce and
// no error): once per version, so that a pod's sync state is on the bus
// (events.XDSAcked) without one event per re-ACK.
func (st *stream) ack(h header) {
	t, v := string(h.TypeURL), string(h.Version)
	if st.acked == nil {
		st.acked = map[string]string{}
	}
	if last, seen := st.acked[t]; seen && last == v {
		return
	}
	st.acked[t] = v
	st.s.publish(events.PodEventXDSAcked, events.XDSAcked{Pod: st.s.cfg.Pod, Stream: st.id, TypeURL: t, Version: v, Nonce: string(h.Nonce)})
}

func (s *Server) disconnected(id, reason string) {
	s.log.Info("stream disconnected", "stream", id, "reason", reason)
	s.publish(events.PodEventXDSDisconnected, events.XDSDisconnected{Pod: s.cfg.Pod, Stream: id, Reason: reason})
}

// publish sends one of the pod's events (kind: events.PodEvent*) on its pod subject.
func (s *Server) publish(kind string, p events.Payload) {
	if s.pub == nil {
		return
	}
	subject, err := events.PodEventSubject(s.cfg.Pod, kind)
	if err != nil {
		s.log.Warn("dropping event", "kind", kind, "error", err)
		return
	}
	s.pub.Publish(subject, p)
}
