// Package store keeps the renewal schedule durable in a JetStream key-value bucket:
// one key per (pod, resource) holding its schedule.Record, plus the trust view.
// Every write of an entry is a compare-and-set on the revision the writer last
// saw, so two rotators that both believe they lead cannot both send the same
// renewal: the second write fails and the loser adopts what the winner wrote.
package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/services/rotator/internal/schedule"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrConflict means another writer changed the entry since its revision was read.
var ErrConflict = errors.New("store: entry changed by another writer")

// ErrKeyTooLong means (pod, resource) would make a key over MaxKeyLen: such an
// entry can never be stored, so the event that asks for it must be refused.
var ErrKeyTooLong = errors.New("store: key too long")

// MaxKeyLen bounds an entry key. The key travels in the NATS control line of
// every write ("PUB $KV.<bucket>.<key> <reply> <size>"), which the server caps at
// 4 KiB by default and answers by closing the connection; 1 KiB leaves ample room
// for the bucket and reply subject while fitting any valid pod ("<namespace>/<name>",
// 63+1+253 characters) and resource (253), so at most 2+423+1+338 bytes.
const MaxKeyLen = 1024

const (
	entryPrefix = "e."
	trustKey    = "trust"
	bundleKey   = "trust-bundle" // not under entryPrefix: Follow skips it
)

// Store is the schedule's bucket.
type Store struct {
	kv     jetstream.KeyValue
	js     jetstream.JetStream
	bucket string
	log    hclog.Logger
}

// Open creates the bucket if it does not exist yet and returns the store.
func Open(ctx context.Context, js jetstream.JetStream, bucket string, replicas int, log hclog.Logger) (*Store, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      bucket,
			Description: "meshagent rotator: renewal schedule",
			History:     1,
			Storage:     jetstream.FileStorage,
			Replicas:    max(replicas, 1),
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open kv bucket %s: %w", bucket, err)
	}
	return &Store{kv: kv, js: js, bucket: bucket, log: log}, nil
}

// Key is the bucket key of (pod, resource). Both are base64url so that any SDS
// resource name and any pod id make a valid key. A key over MaxKeyLen is refused
// with ErrKeyTooLong, before it gets near the bus.
func Key(pod, resource string) (string, error) {
	if resource == "" {
		resource = schedule.DefaultResource
	}
	enc := base64.RawURLEncoding
	if n := len(entryPrefix) + enc.EncodedLen(len(pod)) + 1 + enc.EncodedLen(len(resource)); n > MaxKeyLen {
		return "", fmt.Errorf("%w: %d bytes for pod of %d and resource of %d bytes, max %d",
			ErrKeyTooLong, n, len(pod), len(resource), MaxKeyLen)
	}
	return entryPrefix + enc.EncodeToString([]byte(pod)) + "." + enc.EncodeToString([]byte(resource)), nil
}

// Write stores r. r.Rev 0 means the key must not exist yet; otherwise the key's
// revision must still be r.Rev. It returns the new revision or ErrConflict.
func (s *Store) Write(ctx context.Context, r schedule.Record) (uint64, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("encode record: %w", err)
	}
	k, err := Key(r.Pod, r.Resource)
	if err != nil {
		return 0, err
	}
	var rev uint64
	if r.Rev == 0 {
		rev, err = s.kv.Create(ctx, k, b)
	} else {
		rev, err = s.kv.Update(ctx, k, b, r.Rev)
	}
	if conflict(err) {
		return 0, fmt.Errorf("%w: %s/%s", ErrConflict, r.Pod, r.Resource)
	}
	if err != nil {
		return 0, fmt.Errorf("write %s/%s: %w", r.Pod, r.Resource, err)
	}
	return rev, nil
}

func conflict(err error) bool {
	if err == nil {
		return false
	}
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyNotFound) ||
		errors.Is(err, jetstream.ErrKeyRevisionMismatch) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence)
}

// Delete removes the entry of (pod, resource); rev 0 deletes whatever is there.
func (s *Store) Delete(ctx context.Context, pod, resource string, rev uint64) error {
	var opts []jetstream.KVDeleteOpt
	if rev != 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	k, err := Key(pod, resource)
	if err != nil {
		return err
	}
	err = s.kv.Delete(ctx, k, opts...)
	if conflict(err) {
		return fmt.Errorf("%w: %s/%s", ErrConflict, pod, resource)
	}
	if err != nil {
		return fmt.Errorf("delete %s/%s: %w", pod, resource, err)
	}
	return nil
}

// Get reads the entry of (pod, resource); ok is false when there is none.
func (s *Store) Get(ctx context.Context, pod, resource string) (schedule.Record, bool, error) {
	k, err := Key(pod, resource)
	if err != nil {
		return schedule.Record{}, false, err
	}
	e, err := s.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return schedule.Record{}, false, nil
	}
	if err != nil {
		return schedule.Record{}, false, fmt.Errorf("get %s/%s: %w", pod, resource, err)
	}
	r, err := decode(e)
	if err != nil {
		return schedule.Record{}, false, err
	}
	return r, true, nil
}

func decode(e jetstream.KeyValueEntry) (schedule.Record, error) {
	return decodeRaw(e.Key(), e.Value(), e.Revision())
}

func decodeRaw(key string, value []byte, rev uint64) (schedule.Record, error) {
	var r schedule.Record
	if err := json.Unmarshal(value, &r); err != nil {
		return r, fmt.Errorf("decode %s: %w", key, err)
	}
	if k, err := Key(r.Pod, r.Resource); err != nil || r.Pod == "" || r.Serial == "" || r.NotAfter <= r.NotBefore || k != key {
		return r, fmt.Errorf("decode %s: inconsistent record", key)
	}
	r.Rev = rev
	return r, nil
}

// Bundle is the trust bundle the rotator checked and trusts (roots as PEM), kept so
// that the next leader trusts it, not the first bundle it hears.
type Bundle struct {
	Generation uint64   `json:"generation"`
	Roots      []string `json:"roots"`
}

// PutBundle stores the trusted bundle.
func (s *Store) PutBundle(ctx context.Context, b Bundle) error {
	data, err := json.Marshal(b)
	if err != nil {
		return fmt.Errorf("encode trusted bundle: %w", err)
	}
	if _, err := s.kv.Put(ctx, bundleKey, data); err != nil {
		return fmt.Errorf("write trusted bundle: %w", err)
	}
	return nil
}

// GetBundle reads the trusted bundle; ok is false when none was kept.
func (s *Store) GetBundle(ctx context.Context) (b Bundle, ok bool, err error) {
	e, err := s.kv.Get(ctx, bundleKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Bundle{}, false, nil
	}
	if err != nil {
		return Bundle{}, false, fmt.Errorf("read trusted bundle: %w", err)
	}
	if err := json.Unmarshal(e.Value(), &b); err != nil {
		return Bundle{}, false, fmt.Errorf("decode trusted bundle: %w", err)
	}
	return b, len(b.Roots) > 0, nil
}

// PutTrust stores the trust view.
func (s *Store) PutTrust(ctx context.Context, t schedule.Trust) error {
	b, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("encode trust: %w", err)
	}
	if _, err := s.kv.Put(ctx, trustKey, b); err != nil {
		return fmt.Errorf("write trust: %w", err)
	}
	return nil
}
