// Package natsapi serves the signer over NATS request-reply: signing in the signer
// queue group, the trust bundle, and forced root rotation. Sign requests and their
// replies are in the compact encoding (events.EncodingCompact,
// pkg/events/sign_compact.go), the one encoding of the sign subjects; the bundle
// and rotation requests and replies are CloudEvents (pkg/events).
package natsapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
	"github.com/meshagent/meshagent/services/signer/internal/issuer"
	"github.com/nats-io/nats.go"
)

// Rotator forces a root rotation.
type Rotator interface {
	Rotate(ctx context.Context, newKey bool) (*ca.Material, error)
	RotationPlan(ctx context.Context, newKey, dryRun bool) (*events.RotationPlan, error)
}

// requestTimeout bounds the work on one request, also during shutdown.
const requestTimeout = 15 * time.Second

// PendingPerWorker is how many received requests may wait per worker, at most: the
// waiting room (room.go) admits fewer while the workers' pace would not reach them
// within roomWait, and answers the rest with a slot to come back at. It holds a
// wave's burst: with 4 per worker (256 at the default 64 workers) the pods that
// connected together in a storm sent more at once, and that wait was most of a
// 5,000-pod storm (14.8–15.7 s against 8.2–8.5 s with 64 per worker,
// docs/scale.md). A request that carries its requester's deadline (sds-edge's do)
// is dropped unsigned when a worker reaches it too late, so holding more costs a
// decode, not a signature; a full queue of 4,096 at the default is 6 MiB of
// requests and a second or two of signing.
const PendingPerWorker = 64

// The bundle and rotation requests are rare: they get their own goroutine each, at
// most this many at once.
const otherWorkers = 8

// API answers events.SignWildcard, SubjectTrustBundle and SubjectRootRotate.
type API struct {
	nc          *nats.Conn
	iss         *issuer.Issuer
	auth        *ca.Authority
	rot         Rotator
	trustDomain string
	workers     int
	// signByID takes the identity from an identity sign subject (-bus-sign-id);
	// off, a request there is signed like one on the pod subject, by its token.
	signByID bool
	log      hclog.Logger
	clk      clock.Clock

	ready atomic.Bool
	// tail is the compact sign reply's end for the last CA material signed with.
	tail atomic.Pointer[replyTail]
	// pub stores cert.issued and answers the request from its ack reader once
	// stored: a worker does not wait for the ack. recording counts those waiting.
	pub       *bus.AsyncPublisher
	recording sync.WaitGroup
	sem       chan struct{}
	mu        sync.Mutex
	closed    bool
	wg        sync.WaitGroup
	subs      []*nats.Subscription
	// dropped counts messages dropped by subscriptions already closed.
	dropped uint64
	// federation, if set, answers a bundle request that asks for the foreign
	// domains' state (SetFederationStatus).
	federation atomic.Pointer[FederationStatusFunc]
	// slow counts slow-consumer errors on our subscriptions (one per episode).
	slow atomic.Uint64
	// refused counts requests left unanswered because their reply subject was not
	// their requester's inbox.
	refused atomic.Uint64
	// room admits sign requests to the workers' queue or gives them a slot to come
	// back at; turnedAway counts the latter. intakeMu guards intakeClosed, set once
	// the queue is closed: an intake handler still running then answers nothing.
	room         *waitingRoom
	turnedAway   atomic.Uint64
	inflight     atomic.Int64 // admitted sign requests not yet answered
	intakeMu     sync.RWMutex
	intakeClosed bool
}

// RefusedReplies counts requests left unanswered because their reply subject was
// no inbox, or the inbox of another requester than the one the subject proves.
func (a *API) RefusedReplies() uint64 { return a.refused.Load() }

// SlowConsumerEvents counts the slow-consumer errors NATS reported for the API's
// subscriptions (one per episode of drops, however many it dropped).
func (a *API) SlowConsumerEvents() uint64 { return a.slow.Load() }

func (a *API) ours(sub *nats.Subscription) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Contains(a.subs, sub)
}

// New returns the API; Run subscribes. signByID trusts the identity an identity
// sign subject (events.IdentitySignSubject) names: only when nothing but pods
// admitted by this signer's auth callout can publish there.
func New(nc *nats.Conn, iss *issuer.Issuer, auth *ca.Authority, rot Rotator, trustDomain string, workers int, signByID bool, log hclog.Logger, clk clock.Clock) *API {
	return &API{nc: nc, iss: iss, auth: auth, rot: rot, trustDomain: trustDomain, workers: max(1, workers), signByID: signByID, log: log, clk: clk,
		pub: bus.NewAsyncPublisher(nc, clock.Real{})}
}

// Ready reports whether the subscriptions are in place.
func (a *API) Ready() error {
	if !a.ready.Load() {
		return errors.New("not subscribed")
	}
	return nil
}

// Dropped counts requests NATS dropped because a subscription's pending bound was
// full (the slow-consumer condition its async error handler reports).
func (a *API) Dropped() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.dropped
	for _, s := range a.subs {
		if d, err := s.Dropped(); err == nil {
			n += uint64(d)
		}
	}
	return n
}

// Run subscribes (queue group events.SignerQueue) and serves until ctx is done, then
// unsubscribes and waits for requests in flight. Sign requests go from NATS' read
// loop through one channel to Workers long-lived goroutines: no goroutine is
// started, and no stack grown, per request; a worker signs, hands cert.issued to
// the async publisher and takes the next request, and the reply goes out from the
// publisher's ack reader once the event is stored.
func (a *API) Run(ctx context.Context) error {
	if err := a.pub.Start(); err != nil {
		return err
	}
	a.sem = make(chan struct{}, otherWorkers)
	base := context.WithoutCancel(ctx)
	// Every sign subject's requests wait here, as many as the waiting room admits.
	signs := make(chan *nats.Msg, a.workers*PendingPerWorker)
	a.room = newWaitingRoom(cap(signs), a.clk.Now())
	var workers sync.WaitGroup
	for range a.workers {
		workers.Go(func() {
			for m := range signs {
				a.serveSign(base, m)
			}
		})
	}
	defer a.countSlowConsumers()()
	defer a.stop(signs, &workers)
	subjects, err := a.subscribe(base, signs)
	if err != nil {
		return err
	}
	if err := a.nc.FlushTimeout(10 * time.Second); err != nil && ctx.Err() == nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	a.ready.Store(true)
	a.log.Info("nats api subscribed", "subjects", subjects, "queue", events.SignerQueue, "workers", a.workers)
	<-ctx.Done()
	return nil
}

// serve answers m with h, within requestTimeout from base, when its reply subject
// is a requester's inbox.
func (a *API) serve(base context.Context, h func(context.Context, *nats.Msg), m *nats.Msg) {
	if !replyAllowed(m.Reply) {
		a.refused.Add(1)
		a.log.Warn("request dropped: its reply subject is no requester's inbox", "subject", m.Subject, "reply", m.Reply)
		return
	}
	if !replyToRequester(m.Subject, m.Reply) {
		a.refused.Add(1)
		a.log.Warn("request dropped: its reply subject is another requester's inbox", "subject", m.Subject, "reply", m.Reply)
		return
	}
	rctx, cancel := context.WithTimeout(base, requestTimeout)
	defer cancel()
	h(rctx, m)
}

// async is a handler serving each message with h in a goroutine of its own, at
// most otherWorkers at a time, until the API is stopped.
func (a *API) async(base context.Context, h func(context.Context, *nats.Msg)) nats.MsgHandler {
	return func(m *nats.Msg) {
		a.mu.Lock()
		if a.closed {
			a.mu.Unlock()
			return
		}
		a.wg.Add(1)
		a.mu.Unlock()
		a.sem <- struct{}{}
		go func() {
			defer func() { <-a.sem; a.wg.Done() }()
			a.serve(base, h, m)
		}()
	}
}

// countSlowConsumers counts slow-consumer errors on our subscriptions, then lets
// the connection's own handler (bus.Connect logs them) see every error as before;
// the function it returns puts that handler back alone.
func (a *API) countSlowConsumers() (restore func()) {
	prev := a.nc.ErrorHandler()
	a.nc.SetErrorHandler(func(c *nats.Conn, sub *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrSlowConsumer) && sub != nil && a.ours(sub) {
			a.slow.Add(1)
		}
		if prev != nil {
			prev(c, sub, err)
		}
	})
	return func() { a.nc.SetErrorHandler(prev) }
}

// stop unsubscribes, then waits for the requests in flight: the workers answer
// what is waiting in signs, then end.
func (a *API) stop(signs chan *nats.Msg, workers *sync.WaitGroup) {
	a.mu.Lock()
	for _, s := range a.subs {
		if n, err := s.Dropped(); err == nil {
			a.dropped += uint64(n)
		}
		_ = s.Unsubscribe()
	}
	a.subs = nil
	a.closed = true
	a.mu.Unlock()
	a.ready.Store(false)
	// Unsubscribed: NATS calls intake no more, and one still running sends nothing.
	a.intakeMu.Lock()
	a.intakeClosed = true
	a.intakeMu.Unlock()
	close(signs)
	workers.Wait()
	a.wg.Wait()
	a.recording.Wait() // each is done by its deadline
	a.pub.Stop()
}

// subscribed keeps sub, to stop it with the API.
func (a *API) subscribed(sub *nats.Subscription, err error) error {
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.subs = append(a.subs, sub)
	a.mu.Unlock()
	return nil
}

// subscribe subscribes to every subject the API serves, sign requests into
// signs, and returns the subjects.
func (a *API) subscribe(base context.Context, signs chan *nats.Msg) ([]string, error) {
	// Every sign subject: a request on one this signer does not serve gets a typed
	// refusal, never silence that a client would have to guess about.
	subjects := []string{events.SignWildcard}
	if err := a.subscribeSigns(a.nc.QueueSubscribe(events.SignWildcard, events.SignerQueue, a.intake(signs))); err != nil {
		return nil, err
	}
	// This replica by name (events.SubjectSignerPing): a requester whose request
	// waited out a frozen replica in the queue group asks one that answers.
	replica := ReplicaName(a.iss.Instance())
	if err := a.subscribeSigns(a.nc.Subscribe(events.ReplicaSignWildcard(replica), a.intake(signs))); err != nil {
		return nil, err
	}
	if err := a.subscribed(a.nc.Subscribe(events.SubjectSignerPing, func(m *nats.Msg) {
		if replyAllowed(m.Reply) && replyToRequester(m.Subject, m.Reply) && m.Reply != "" {
			a.respond(m, events.SignerPong{Replica: replica})
		} else if m.Reply != "" {
			a.refused.Add(1)
		}
	})); err != nil {
		return nil, err
	}
	subjects = append(subjects, events.ReplicaSignWildcard(replica), events.SubjectSignerPing)
	for _, s := range []struct {
		subject string
		h       func(context.Context, *nats.Msg)
	}{{events.SubjectTrustBundle, a.bundle}, {events.SubjectRootRotate, a.rotate}} {
		subjects = append(subjects, s.subject)
		sub, err := a.nc.QueueSubscribe(s.subject, events.SignerQueue, a.async(base, s.h))
		if err := a.subscribed(sub, err); err != nil {
			return nil, err
		}
		if err := sub.SetPendingLimits(otherWorkers*PendingPerWorker, 64<<20); err != nil {
			return nil, fmt.Errorf("pending limits %s: %w", s.subject, err)
		}
	}
	return subjects, nil
}

// ReplicaName is the name a signer replica answers the ping with and is reached
// by (events.ReplicaSignSubject): its instance id when that is one subject token,
// else a name derived from it (a host name with dots).
func ReplicaName(instance string) string {
	if events.ValidateIdentityToken(instance) == nil {
		return instance
	}
	sum := sha256.Sum256([]byte(instance))
	return "signer-" + hex.EncodeToString(sum[:6])
}

// Reply subjects the signer answers on: a requester's inbox (every role's is under
// _INBOX., pkg/bus/policy), never its own.
var (
	inboxes  = "_INBOX."
	ownInbox = policy.Inbox(policy.Signer, events.PodRef{}) + "."
)

// replyAllowed reports whether the signer may answer a request on reply. The reply
// subject is the requester's choice, and the signer may itself publish into its CA
// bucket, its events and the JetStream API: a reply sent there would write the
// answer into the signer's own state (a pod asking for the bundle with reply
// "$KV.meshagent-ca.root" overwrote the CA record). No reply (nothing is sent) is fine.
func replyAllowed(reply string) bool {
	return reply == "" || strings.HasPrefix(reply, inboxes) && !strings.HasPrefix(reply, ownInbox)
}

func (a *API) respond(req *nats.Msg, p events.Payload) {
	if req.Reply == "" {
		return
	}
	m, err := events.NewMsg(req.Reply, a.iss.Source(), p)
	if err != nil {
		a.log.Error("encode reply failed", "type", p.EventType(), "error", err)
		return
	}
	if err := a.nc.PublishMsg(m); err != nil {
		a.log.Warn("send reply failed", "error", err)
	}
}

func decodeCode(err error) string {
	if errors.Is(err, events.ErrTooLarge) {
		return events.CodeResourceExhausted
	}
	return events.CodeInvalidArgument
}

// signVia is what a sign subject proves. Only the pod itself may publish on its pod
// sign subject (bus permissions), so that subject proves the pod; so does its
// identity sign subject, where the callout admitted the connection with a token
// proving namespace, service account and pod — with signByID the subject proves all
// three, without it the request's token is verified as on the pod subject; a
// node sign subject proves the node the request came through (only that node's
// leaf connection may publish below it), and the token, verified, must bind the
// pod to that node; SubjectSignAny proves nothing.
func (a *API) signVia(subject string) (issuer.Via, bool) {
	via := issuer.Via{Transport: issuer.TransportNATS}
	if subject == events.SubjectSignAny {
		return via, true
	}
	if pod, ok := events.PodFromSubject(subject); ok {
		via.BusPod = pod
		return via, true
	}
	if node, pod, ok := events.NodeFromSignSubject(subject); ok {
		via.BusPod, via.BusNode = pod, node
		return via, true
	}
	pod, sa, ok := events.IdentityFromSignSubject(subject)
	if !ok {
		return via, false
	}
	if !a.signByID {
		via.BusPod = pod
		return via, true
	}
	id, err := pki.WorkloadID(a.trustDomain, pod.Namespace, sa)
	if err != nil {
		return via, false
	}
	via.BusPod, via.BusID = pod, id.URL()
	return via, true
}

func replyError(err error) *events.ReplyError {
	var ie *issuer.Error
	if errors.As(err, &ie) {
		return &events.ReplyError{Code: ie.Code, Message: ie.Msg}
	}
	return &events.ReplyError{Code: events.CodeInternal, Message: err.Error()}
}

// FederationStatusFunc gives the followed foreign domains' state as JSON and
// the CA's endorsements of it.
type FederationStatusFunc func() (json.RawMessage, []events.Endorsement, error)

// SetFederationStatus makes bundle requests that ask for it answer the state
// of the followed foreign domains from fn.
func (a *API) SetFederationStatus(fn FederationStatusFunc) { a.federation.Store(&fn) }

func (a *API) bundle(ctx context.Context, m *nats.Msg) {
	req, _, err := events.Decode[events.BundleRequest](m)
	if err != nil {
		a.respond(m, events.BundleReply{Error: &events.ReplyError{Code: decodeCode(err), Message: err.Error()}})
		return
	}
	mat := a.auth.Current()
	if mat == nil {
		a.respond(m, events.BundleReply{Error: &events.ReplyError{Code: events.CodeUnavailable, Message: "CA not loaded yet"}})
		return
	}
	reply := events.BundleReply{TrustDomain: a.trustDomain, Roots: mat.RootPEMs(), Generation: mat.Generation, Endorsements: mat.Endorsements()}
	if fn := a.federation.Load(); req.Federation && fn != nil {
		raw, es, err := (*fn)()
		if err != nil {
			a.respond(m, events.BundleReply{Error: &events.ReplyError{Code: events.CodeUnavailable, Message: "federation status: " + err.Error()}})
			return
		}
		reply.Federation, reply.FederationEndorsements = raw, es
	}
	if req.Rotation && a.rot != nil {
		if plan, err := a.rot.RotationPlan(ctx, false, false); err == nil {
			reply.Rotation = plan
		}
	}
	a.respond(m, reply)
}

func (a *API) rotate(ctx context.Context, m *nats.Msg) {
	req, _, err := events.Decode[events.RotateRequest](m)
	if err != nil {
		a.respond(m, events.RotateReply{Error: &events.ReplyError{Code: decodeCode(err), Message: err.Error()}})
		return
	}
	a.log.Info("root rotation requested", "new_key", req.NewKey, "reason", req.Reason, "dry_run", req.DryRun)
	var mat *ca.Material
	if req.DryRun {
		var plan *events.RotationPlan
		if plan, err = a.rot.RotationPlan(ctx, req.NewKey, true); err == nil {
			rep := events.RotateReply{Plan: plan}
			if cur := a.auth.Current(); cur != nil {
				rep.Fingerprint, rep.Roots = cur.RootFingerprint(), cur.RootPEMs()
			}
			a.respond(m, rep)
			return
		}
	} else {
		mat, err = a.rot.Rotate(ctx, req.NewKey)
	}
	if err != nil {
		code := events.CodeInternal
		switch {
		case errors.Is(err, ca.ErrNotSupported):
			code = events.CodeInvalidArgument
		case errors.Is(err, ca.ErrRotateTooSoon), errors.Is(err, ca.ErrBundleFull):
			code = events.CodeResourceExhausted
		}
		if code == events.CodeInternal {
			a.log.Error("root rotation failed", "error", err)
		} else {
			a.log.Warn("root rotation refused", "code", code, "error", err)
		}
		a.respond(m, events.RotateReply{Error: &events.ReplyError{Code: code, Message: err.Error()}})
		return
	}
	plan, _ := a.rot.RotationPlan(ctx, false, false) // the rotation just made
	a.respond(m, events.RotateReply{Fingerprint: mat.RootFingerprint(), Roots: mat.RootPEMs(), Plan: plan})
}
