package auditlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ScanBatch is how many messages one batched direct get asks for, and
// ScanBatchBytes how many bytes at most: the server sends a batch at once, and a
// reader must not be sent more than nats-server lets wait for one client
// (max_pending, pkg/bus/embedded.MaxPending), or it is cut off as a slow consumer
// (256 pod events of 64 KiB are 16 MiB).
const (
	ScanBatch      = 256
	ScanBatchBytes = 2 << 20
)

// Scan calls fn, in order, for every message of st on a subject matching filter
// from sequence from up to sequence upto (0: to the end), with only read rights
// (direct get, or message get): no consumer. When the stream allows direct gets, a
// request brings up to ScanBatch messages (nats-server ≥ 2.11), else one.
func Scan(ctx context.Context, nc *nats.Conn, st jetstream.Stream, filter string, from, upto uint64, fn func(*jetstream.RawStreamMsg) error) error {
	info := st.CachedInfo()
	direct := info != nil && info.Config.AllowDirect
	for seq := max(from, 1); upto == 0 || seq <= upto; {
		var msgs []*jetstream.RawStreamMsg
		var err error
		if direct {
			msgs, err = directBatch(ctx, nc, info.Config.Name, filter, seq)
		} else {
			var m *jetstream.RawStreamMsg
			m, err = st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
			if m != nil {
				msgs = append(msgs, m)
			}
		}
		if errors.Is(err, jetstream.ErrMsgNotFound) || err == nil && len(msgs) == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s at %d: %w", st.CachedInfo().Config.Name, seq, err)
		}
		for _, m := range msgs {
			if upto != 0 && m.Sequence > upto {
				return nil
			}
			if err := fn(m); err != nil {
				return err
			}
			seq = m.Sequence + 1
		}
	}
	return nil
}

// directBatch asks for up to ScanBatch messages from seq on ($JS.API.DIRECT.GET):
// they come to one inbox, ended by a 204 (end of batch) or, with none, a 404.
func directBatch(ctx context.Context, nc *nats.Conn, stream, filter string, seq uint64) ([]*jetstream.RawStreamMsg, error) {
	req, err := json.Marshal(struct {
		Seq      uint64 `json:"seq"`
		Batch    int    `json:"batch"`
		MaxBytes int    `json:"max_bytes"`
		NextFor  string `json:"next_by_subj"`
	}{seq, ScanBatch, ScanBatchBytes, filter})
	if err != nil {
		return nil, err
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, req); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out []*jetstream.RawStreamMsg
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return out, fmt.Errorf("direct get: %w", err)
		}
		switch m.Header.Get("Status") {
		case "204": // end of batch
			return out, nil
		case "404":
			return out, jetstream.ErrMsgNotFound
		case "":
		default:
			return out, fmt.Errorf("direct get: status %s %s", m.Header.Get("Status"), m.Header.Get("Description"))
		}
		n, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return out, fmt.Errorf("direct get: sequence %q: %w", m.Header.Get(jetstream.SequenceHeader), err)
		}
		ts, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
		out = append(out, &jetstream.RawStreamMsg{Subject: m.Header.Get(jetstream.SubjectHeader), Sequence: n, Header: m.Header, Data: m.Data, Time: ts})
	}
}
