package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/events"
)

// TestProxyStatusFoldsThePodsEvents: streams open, ACK versions per type, a NACK
// after an ACK (shown with the version still served), a stream closed, a pod down,
// a relay restarted (its stream ids start again).
func TestProxyStatusFoldsThePodsEvents(t *testing.T) {
	now := time.Now()
	a, b := events.PodRef{Namespace: "default", Name: "demo-0"}, events.PodRef{Namespace: "shop", Name: "web-0"}
	cds, lds := "type.googleapis.com/envoy.config.cluster.v3.Cluster", "type.googleapis.com/envoy.config.listener.v3.Listener"
	at := func(d time.Duration) events.Meta { return events.Meta{Time: now.Add(-d)} }
	x := newXDSTypes()
	for _, e := range []auditlog.Entry{
		{Meta: at(10 * time.Minute), Payload: events.XDSConnected{Pod: a, Stream: "1", Mode: "sotw", Upstream: "127.0.0.1:15010"}},
		{Meta: at(9 * time.Minute), Payload: events.XDSAcked{Pod: a, Stream: "1", TypeURL: cds, Version: "v1"}},
		{Meta: at(9 * time.Minute), Payload: events.XDSAcked{Pod: a, Stream: "1", TypeURL: lds, Version: "v1"}},
		{Meta: at(5 * time.Minute), Payload: events.XDSAcked{Pod: a, Stream: "1", TypeURL: cds, Version: "v2"}},
		{Meta: at(2 * time.Minute), Payload: events.XDSNack{Pod: a, Stream: "1", TypeURL: lds, Nonce: "7", ErrorDetail: "bad listener"}},
		{Meta: at(8 * time.Minute), Payload: events.XDSConnected{Pod: b, Stream: "1", Mode: "delta", Upstream: "istiod:15012"}},
		{Meta: at(7 * time.Minute), Payload: events.XDSDisconnected{Pod: b, Stream: "1", Reason: "upstream: unavailable"}},
		{Meta: at(6 * time.Minute), Payload: events.XDSConnected{Pod: b, Stream: "2", Mode: "delta", Upstream: "istiod:15012"}},
		{Meta: at(6 * time.Minute), Payload: events.XDSAcked{Pod: b, Stream: "2", TypeURL: cds}},
		{Meta: at(time.Minute), Payload: events.PodDown{Pod: b, Reason: "SIGTERM"}},
	} {
		x.add(e)
	}
	open := x.list(false, "")
	if len(open) != 1 || open[0].Pod != "default/demo-0" {
		t.Fatalf("open streams: %+v", open)
	}
	var out bytes.Buffer
	printStreams(&out, open, now)
	text := out.String()
	for _, want := range []string{"POD", "CDS", "LDS", "default/demo-0", "1 sotw", "127.0.0.1:15010", "ACK v2 5m", "NACK 7 2m", "(last ACK v1)"} {
		if !strings.Contains(text, want) {
			t.Errorf("proxy-status lacks %q:\n%s", want, text)
		}
	}
	all := x.list(true, "shop/web-0")
	if len(all) != 2 || all[0].Closed.IsZero() || all[1].Reason != "pod down: SIGTERM" || all[1].Types[cds].Acked != "(delta)" {
		t.Fatalf("web-0's streams: %+v %+v", all[0], all[1])
	}
	// A relay restarted: stream 1 of demo-0 again is a new stream, its old types gone.
	x.add(auditlog.Entry{Meta: at(0), Payload: events.XDSConnected{Pod: a, Stream: "1", Mode: "sotw", Upstream: "127.0.0.1:15010"}})
	if s := x.list(false, "default/demo-0"); len(s) != 1 || len(s[0].Types) != 0 {
		t.Fatalf("after a relay restart: %+v", s)
	}
}
