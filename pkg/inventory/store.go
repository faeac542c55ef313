package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// Snapshot is the whole inventory at one moment.
type Snapshot struct {
	Certs []Cert `json:"certificates"` // by expiry, soonest first
	Trust *Trust `json:"trust,omitempty"`
	// Windows are the counter records (counters.go), by minute: sum them with Counted.
	Windows []Window `json:"counters,omitempty"`
	// Skipped are the records that could not be read (by key): left out of Certs
	// and Trust, so that one bad record hides itself and nothing else.
	Skipped []Skipped `json:"skipped,omitempty"`
}

// Skipped is one record left out of a snapshot, and why.
type Skipped struct {
	Key    string `json:"key"`
	Reason string `json:"reason"`
}

// SkippedLine is what a reader prints about the records it left out ("" when
// none): a count and the first few keys.
func (s Snapshot) SkippedLine() string {
	if len(s.Skipped) == 0 {
		return ""
	}
	var keys []string
	for i, k := range s.Skipped {
		if i == 3 {
			keys = append(keys, "...")
			break
		}
		keys = append(keys, fmt.Sprintf("%s (%s)", k.Key, k.Reason))
	}
	return fmt.Sprintf("warning: %d malformed inventory record(s) skipped: %s", len(s.Skipped), strings.Join(keys, ", "))
}

// Find returns the certificates held by pod ("<namespace>/<name>", a bare name in
// the default namespace), or with a serial starting with what (case-insensitive,
// at least 6 hex digits).
func (s Snapshot) Find(what string) []Cert {
	pod := ""
	if p, err := events.ParsePodRef(what); err == nil {
		pod = p.String()
	}
	var out []Cert
	for _, c := range s.Certs {
		if pod != "" && c.Pod == pod || len(what) >= 6 && strings.HasPrefix(strings.ToLower(c.Serial), strings.ToLower(what)) {
			out = append(out, c)
		}
	}
	return out
}

// compareCerts orders certificates by expiry, then holder (pointers: a Cert is a
// few hundred bytes, and a fleet's sort compares millions of pairs).
func compareCerts(a, b *Cert) int {
	if c := a.NotAfter.Compare(b.NotAfter); c != 0 {
		return c
	}
	return strings.Compare(a.Pod, b.Pod)
}

// maxReason bounds the text of a skip reason (it quotes what the record held).
const maxReason = 120

// Decode builds a snapshot from the bucket's current values by key. A record that
// cannot be read (not JSON, not a trust or certificate record) is left out and
// listed in Skipped: anyone holding the inventory credential can write any value,
// and one bad value must not hide the whole fleet.
func Decode(values map[string][]byte) Snapshot {
	v := NewView()
	for k, b := range values {
		v.Put(k, b)
	}
	return v.Snapshot()
}

// printable is s cut at n bytes with every control or invalid character replaced:
// a skipped record's key and reason are the writer's bytes, printed on terminals.
func printable(s string, n int) string {
	cut := len(s) > n
	if cut {
		s = s[:n]
	}
	s = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, s)
	if cut {
		s += "..."
	}
	return s
}

// check reports what a certificate record lacks that every reader relies on.
func (c *Cert) check() error {
	var missing []string
	if c.Serial == "" {
		missing = append(missing, "serial")
	}
	if c.SPIFFEID == "" {
		missing = append(missing, "spiffe_id")
	}
	if c.NotAfter.IsZero() || c.NotBefore.IsZero() {
		missing = append(missing, "validity")
	}
	if len(missing) > 0 {
		return fmt.Errorf("not a certificate record: no %s", strings.Join(missing, ", "))
	}
	return nil
}

// Keeper keeps the bucket current from the event stream through the durable
// consumer "inventory". Several keepers may run: they share the durable, and every
// write is a compare-and-set of a fold that is idempotent, so any order of delivery
// and any redelivery ends in the same records.
type Keeper struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	clk clock.Clock
	log hclog.Logger
	// Applied is called after each event is folded in and counted (tests,
	// metrics); may be nil.
	Applied func(events.Payload)

	counts counting
}

// Subjects the keeper consumes: three from the CA's history, then four from the
// pods' events (the NACKs only to count them).
var Subjects = []string{
	events.SubjectCertIssued, events.SubjectTrustChanged, events.SubjectRenewSent,
	events.PodEventWildcard(events.PodEventSecretPushed), events.PodEventWildcard(events.PodEventDown),
	events.PodEventWildcard(events.PodEventSDSNack), events.PodEventWildcard(events.PodEventXDSNack),
}

// NewKeeper opens (or creates) the bucket. Replicas is the bucket's replica count;
// clk tells the time of the counts and times the waits.
func NewKeeper(ctx context.Context, nc *nats.Conn, replicas int, clk clock.Clock, log hclog.Logger) (*Keeper, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	// A cluster that has just lost a node or changed its meta leader may not place a
	// replicated bucket yet ("no suitable peers"): wait, as every service does.
	var kv jetstream.KeyValue
	err = bus.Retry(ctx, clk, log, "inventory bucket "+policy.BucketInventory, func(ctx context.Context) (err error) {
		kv, err = OpenBucket(ctx, js, replicas)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Keeper{nc: nc, js: js, kv: kv, clk: clk, log: log}, nil
}

// OpenBucket creates or opens the inventory bucket.
func OpenBucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, policy.BucketInventory)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: policy.BucketInventory, History: 1,
			Description: "meshagent certificate inventory (the operator service)", Replicas: max(replicas, 1), Storage: jetstream.FileStorage})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, policy.BucketInventory)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("inventory bucket %s: %w", policy.BucketInventory, err)
	}
	return kv, nil
}

// Bucket is the keeper's bucket (for a live view: Watch).
func (k *Keeper) Bucket() jetstream.KeyValue { return k.kv }

// Run consumes until ctx ends. It first asks the signers for the trust bundle, so
// that the roots are known even when the stream holds no trust.changed (a bundle
// older than the history).
func (k *Keeper) Run(ctx context.Context) error {
	if err := k.bootstrapTrust(ctx); err != nil {
		k.log.Warn("trust bundle not known until the next trust.changed", "error", err)
	}
	// One durable on each stream: the CA's history and the pods' events.
	g, gctx := errgroup.WithContext(ctx)
	for stream, subjects := range map[string][]string{events.StreamEvents: Subjects[:3], events.StreamPodEvents: Subjects[3:]} {
		cons, err := k.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
			Durable: policy.InventoryConsumer, Description: "meshagent certificate inventory",
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: maxDeliver,
			DeliverPolicy: jetstream.DeliverAllPolicy, FilterSubjects: subjects,
		})
		if err != nil {
			return fmt.Errorf("inventory consumer on %s: %w", stream, err)
		}
		g.Go(func() error { return k.consume(gctx, cons) })
	}
	g.Go(func() error { return k.countLoop(gctx) })
	return g.Wait()
}

// consume folds cons's events in until ctx ends.
func (k *Keeper) consume(ctx context.Context, cons jetstream.Consumer) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(64))
	if err != nil {
		return fmt.Errorf("inventory consumer: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		m, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
			return nil
		}
		if err != nil {
			k.log.Warn("inventory fetch", "error", err)
			if !backoff.Wait(ctx, k.clk, time.Second) {
				return nil
			}
			continue
		}
		k.handle(ctx, m)
	}
}

func (k *Keeper) bootstrapTrust(ctx context.Context) error {
	req, err := events.Encode(events.SubjectTrustBundle, events.Meta{Source: "meshctl-serve", Time: k.clk.Now()}, events.BundleRequest{})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := k.nc.RequestMsgWithContext(rctx, req)
	if err != nil {
		return fmt.Errorf("trust bundle: %w", err)
	}
	reply, meta, err := events.Decode[events.BundleReply](resp)
	if err != nil {
		return fmt.Errorf("trust bundle: %w", err)
	}
	if reply.Error != nil {
		return fmt.Errorf("trust bundle: %w", reply.Error)
	}
	if meta.Time.IsZero() {
		meta.Time = k.clk.Now()
	}
	return k.Fold(ctx, events.TrustChanged{TrustDomain: reply.TrustDomain, Roots: reply.Roots, Generation: reply.Generation,
		Reason: "bundle-request"}, meta)
}

func (k *Keeper) handle(ctx context.Context, m jetstream.Msg) {
	p, meta, err := events.DecodeAny(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	if err != nil {
		k.log.Warn("inventory: undecodable event dropped", "subject", m.Subject(), "error", err)
		_ = m.Term()
		return
	}
	if meta.Time.IsZero() {
		if md, err := m.Metadata(); err == nil {
			meta.Time = md.Timestamp
		}
	}
	// What a pod publishes about itself is taken only from that pod (its subject,
	// which the bus lets no other pod publish on): a pod.down or sds.pushed naming
	// another pod, even one of the same name in another namespace, changes nothing.
	if err := fromItsPod(m.Subject(), p); err != nil {
		k.log.Warn("inventory: event for another pod dropped", "subject", m.Subject(), "error", err)
		_ = m.Term()
		return
	}
	if err := k.Fold(ctx, p, meta); err != nil {
		var n uint64 = 1
		if md, err := m.Metadata(); err == nil {
			n = md.NumDelivered
		}
		if errors.Is(err, errNotYet) && n >= maxDeliver-1 {
			// A push of a certificate the inventory never saw issued, after ~2 minutes
			// of waiting for its cert.issued (which another keeper, or a slow one, may
			// still be folding): nothing to record.
			_ = m.Ack()
			return
		}
		if !errors.Is(err, errNotYet) {
			k.log.Warn("inventory update failed, will retry", "subject", m.Subject(), "error", err)
		}
		_ = m.NakWithDelay(redeliverAfter(n))
		return
	}
	if d, ok := Count(p, meta, k.clk.Now()); ok {
		k.counts.hold(d, m, p) // acknowledged once its count is stored (countLoop)
		return
	}
	_ = m.Ack()
	if k.Applied != nil {
		k.Applied(p)
	}
}

// Fold applies one event to the bucket.
func (k *Keeper) Fold(ctx context.Context, p events.Payload, meta events.Meta) error {
	key := KeyOf(p)
	switch {
	case key == "":
		return nil
	case key == TrustKey:
		tc := p.(events.TrustChanged)
		return k.update(ctx, key, func(v []byte) ([]byte, bool, error) {
			var cur *Trust
			if v != nil {
				cur = &Trust{}
				if err := json.Unmarshal(v, cur); err != nil {
					cur = nil
				}
			}
			next, changed := ApplyTrust(cur, tc, meta)
			if !changed {
				return nil, false, nil
			}
			b, err := json.Marshal(next)
			return b, true, err
		})
	case strings.HasSuffix(key, "."): // pod.down: every record of the pod
		keys, err := k.kv.ListKeysFiltered(ctx, key+">")
		if err != nil {
			return err
		}
		for name := range keys.Keys() {
			if err := k.updateCert(ctx, name, p, meta); err != nil {
				return err
			}
		}
		return nil
	default:
		return k.updateCert(ctx, key, p, meta)
	}
}

func (k *Keeper) updateCert(ctx context.Context, key string, p events.Payload, meta events.Meta) error {
	return k.update(ctx, key, func(v []byte) ([]byte, bool, error) {
		var cur *Cert
		if v != nil {
			cur = &Cert{}
			if err := json.Unmarshal(v, cur); err != nil {
				cur = nil
			}
		}
		if d, ok := p.(events.PodDown); ok && (cur == nil || cur.Pod != d.Pod.String()) {
			return nil, false, nil
		}
		// A push can be delivered before the cert.issued of what it pushed (keepers
		// share the durable): come back to it once that certificate is in.
		if sp, ok := p.(events.SecretPushed); ok && (cur == nil || !strings.EqualFold(cur.Serial, sp.Serial) && meta.Time.After(cur.Issued)) {
			return nil, false, errNotYet
		}
		next, changed := Apply(cur, p, meta)
		if !changed {
			return nil, false, nil
		}
		b, err := json.Marshal(next)
		return b, true, err
	})
}

// update is a compare-and-set loop: read, fold, write at the read revision.
func (k *Keeper) update(ctx context.Context, key string, fold func([]byte) ([]byte, bool, error)) error {
	for attempt := 0; ; attempt++ {
		var cur []byte
		var rev uint64
		e, err := k.kv.Get(ctx, key)
		switch {
		case err == nil:
			cur, rev = e.Value(), e.Revision()
		case errors.Is(err, jetstream.ErrKeyNotFound):
		default:
			return err
		}
		next, changed, err := fold(cur)
		if err != nil || !changed {
			return err
		}
		if rev == 0 {
			_, err = k.kv.Create(ctx, key, next)
		} else {
			_, err = k.kv.Update(ctx, key, next, rev)
		}
		if err == nil {
			return nil
		}
		if conflict(err) && attempt < 20 {
			continue // another keeper wrote first: fold again on its record
		}
		return err
	}
}

// maxDeliver is how often the inventory's consumer offers one event.
const maxDeliver = 10

// redeliverAfter is the wait before the n+1st delivery of an event that could not be
// folded yet: 1 s doubling to 30 s, so that a push whose cert.issued is still being
// folded (by another keeper, on a loaded machine) waits minutes, not seconds.
func redeliverAfter(n uint64) time.Duration {
	d := time.Second << min(n-1, 5)
	return min(d, 30*time.Second)
}

// errNotYet: the event is about a certificate the inventory has not seen yet.
var errNotYet = errors.New("certificate not in the inventory yet")

// conflict reports a compare-and-set lost to another writer.
func conflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) ||
		errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// fromItsPod is nil unless p is an event a pod publishes about itself whose pod is
// not the one its subject names.
func fromItsPod(subject string, p events.Payload) error {
	var pod events.PodRef
	switch e := p.(type) {
	case events.PodDown:
		pod = e.Pod
	case events.SecretPushed:
		pod = e.Pod
	default:
		return nil
	}
	if from, ok := events.PodFromSubject(subject); !ok || from != pod {
		return fmt.Errorf("%s for pod %q on subject %s", p.EventType(), pod, subject)
	}
	return nil
}
