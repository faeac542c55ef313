// Package issued is the signer's record of the certificates it issued to pods: one
// entry per certificate in the JetStream KV bucket meshagent-issued, keyed by serial,
// naming the pod and the exact certificate (its SHA-256), kept until the certificate
// expires (a per-message TTL). Only signers may write the bucket (pkg/bus/policy).
// The bus auth callout reads it to admit a connection by its client certificate as
// a pod: a certificate chaining to the mesh's roots names a service account, not a
// pod, and one this mesh's signers did not issue to a pod has no record here.
package issued

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Record is what the bucket keeps of one certificate issued to a pod.
type Record struct {
	// Pod is the pod the certificate was issued to, namespace and name ("ns/name").
	Pod events.PodRef `json:"pod"`
	// PodUID is that pod's UID when its token carried one (kubernetes.io.pod.uid):
	// a pod recreated under the same name has another.
	PodUID   string    `json:"pod_uid,omitempty"`
	SPIFFEID string    `json:"spiffe_id"`
	SHA256   string    `json:"sha256"` // of the certificate's DER: only that certificate matches
	NotAfter time.Time `json:"not_after"`
}

// ErrNoRecord is a certificate the bucket holds no record of: not issued by this
// mesh's signers to a pod, or expired.
var ErrNoRecord = errors.New("no record of this certificate")

// markerTTL is how long the bucket keeps the marker of an expired record.
const markerTTL = time.Minute

// skew keeps a record a little longer than its certificate, for clocks that differ.
const skew = time.Minute

// Store reads and writes the bucket.
type Store struct {
	js       jetstream.JetStream
	replicas int
	log      hclog.Logger
	kv       jetstream.KeyValue
}

// New returns a store on js; Open creates or opens the bucket.
func New(js jetstream.JetStream, replicas int, log hclog.Logger) *Store {
	return &Store{js: js, replicas: max(1, replicas), log: log}
}

// Open creates the bucket, or updates it, retrying while JetStream is cold.
func (s *Store) Open(ctx context.Context) error {
	return bus.Retry(ctx, clock.Real{}, s.log, "issued bucket "+policy.BucketIssued, func(ctx context.Context) error {
		kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: policy.BucketIssued, Description: "meshagent: which pod each certificate was issued to (read by the bus auth callout)",
			History: 1, Replicas: s.replicas, Storage: jetstream.FileStorage, LimitMarkerTTL: markerTTL,
		})
		if err != nil {
			return err
		}
		s.kv = kv
		return nil
	})
}

// Msg is the bucket write recording that leaf was issued to pod (with its UID, ""
// when unknown), until leaf
// expires, for the caller to store durably (bus.Publish, bus.AsyncPublisher): a
// JetStream publish on the bucket's subject whose dedup id is the serial, so a
// retried write is stored once.
func (s *Store) Msg(leaf *x509.Certificate, pod events.PodRef, podUID string, now time.Time) (*nats.Msg, error) {
	serial := pki.SerialHex(leaf)
	if err := pod.Validate(); err != nil {
		return nil, fmt.Errorf("issued record %s: %w", serial, err)
	}
	data, err := json.Marshal(Record{Pod: pod, PodUID: podUID, SPIFFEID: leaf.URIs[0].String(), SHA256: pki.Fingerprint(leaf), NotAfter: leaf.NotAfter})
	if err != nil {
		return nil, fmt.Errorf("issued record %s: %w", serial, err)
	}
	msg := nats.NewMsg("$KV." + policy.BucketIssued + "." + serial)
	msg.Data = data
	msg.Header.Set(jetstream.MsgTTLHeader, max(leaf.NotAfter.Sub(now)+skew, time.Second).Round(time.Second).String())
	msg.Header.Set(events.HeaderID, "issued-"+serial)
	return msg, nil
}

// Put records that leaf was issued to pod (Msg), and returns once it is stored.
func (s *Store) Put(ctx context.Context, leaf *x509.Certificate, pod events.PodRef, podUID string, now time.Time) error {
	msg, err := s.Msg(leaf, pod, podUID, now)
	if err != nil {
		return err
	}
	return bus.Publish(ctx, s.js, msg)
}

// Get returns the record of the certificate with this serial (hex, as
// pki.SerialHex), ErrNoRecord when there is none.
func (s *Store) Get(ctx context.Context, serial string) (Record, error) {
	if s.kv == nil {
		return Record{}, errors.New("issued bucket not open yet")
	}
	e, err := s.kv.Get(ctx, serial)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Record{}, ErrNoRecord
	}
	if err != nil {
		return Record{}, fmt.Errorf("issued record %s: %w", serial, err)
	}
	var r Record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return Record{}, fmt.Errorf("issued record %s: %w", serial, err)
	}
	if err := r.Pod.Validate(); err != nil {
		return Record{}, fmt.Errorf("issued record %s: %w", serial, err)
	}
	return r, nil
}
