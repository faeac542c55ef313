package inventory

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Read loads the inventory with read-only rights (the audit role): the bucket's
// stream read message by message, the last value of each key winning. No consumer is
// created. It reads the whole fleet: a reader of one pod or one page uses
// ReadKeys or the operator's index (package fleetindex).
func Read(ctx context.Context, nc *nats.Conn) (Snapshot, error) {
	values, err := ReadValues(ctx, nc)
	if err != nil {
		return Snapshot{}, err
	}
	return Decode(values), nil
}

// ReadValues is the bucket's current values by key, read as Read does.
func ReadValues(ctx context.Context, nc *nats.Conn) (map[string][]byte, error) {
	return readUnder(ctx, nc, ">")
}

// ReadKeys is a snapshot of the records of keys (a key, or a key prefix ending
// in ".>": PodKeys), read by key: the server hands over those keys' messages and
// no other, so it costs those records whatever the fleet's size.
func ReadKeys(ctx context.Context, nc *nats.Conn, keys ...string) (Snapshot, error) {
	values := map[string][]byte{}
	for _, k := range keys {
		vs, err := readUnder(ctx, nc, k)
		if err != nil {
			return Snapshot{}, err
		}
		for key, v := range vs {
			values[key] = v
		}
	}
	return Decode(values), nil
}

// readUnder is the current values of the keys matching filter (a subject below
// the bucket's: a key, or with wildcards), by key.
func readUnder(ctx context.Context, nc *nats.Conn, filter string) (map[string][]byte, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, "KV_"+policy.BucketInventory)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("no inventory on this bus yet (bucket %s): is the operator service running?", policy.BucketInventory)
	}
	if err != nil {
		return nil, fmt.Errorf("inventory bucket: %w", err)
	}
	prefix := "$KV." + policy.BucketInventory + "."
	values := map[string][]byte{}
	err = auditlog.Scan(ctx, nc, st, prefix+filter, 1, 0, func(m *jetstream.RawStreamMsg) error {
		key := strings.TrimPrefix(m.Subject, prefix)
		switch m.Header.Get("KV-Operation") {
		case "DEL", "PURGE":
			delete(values, key)
		default:
			values[key] = m.Data
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read inventory: %w", err)
	}
	return values, nil
}

// PodKeys is the key filter of every record of pod (for ReadKeys).
func PodKeys(pod events.PodRef) string { return podPrefix(pod) + ">" }

// KeyOfCert is the key of c's record: its holder's (CertKey).
func KeyOfCert(c Cert) string {
	pod, _ := events.ParsePodRef(c.Pod)
	if c.Pod == "" {
		pod = events.PodRef{}
	}
	return CertKey(pod, c.Resource, c.SPIFFEID)
}
