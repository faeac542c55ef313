package proxyconfig

import (
	"context"
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
)

// upstreamTLS counts the anchors handed to the relay's own upstream TLS.
type upstreamTLS struct {
	mu    sync.Mutex
	calls int
}

func (s *upstreamTLS) SetAnchors([]*x509.Certificate) error {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	return nil
}

func pc(t *testing.T, pems ...string) *anypb.Any {
	a, err := anypb.New(&meshv1alpha1.ProxyConfig{CaCertificatesPem: pems})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestHandle(t *testing.T) {
	ns := bustest.Server(t)
	nc := bustest.Conn(t, ns)
	subj, _ := events.PodAnchorsSubject(events.PodRef{Namespace: "default", Name: "web-0"})
	got := make(chan *nats.Msg, 16)
	if _, err := nc.ChanSubscribe(subj, got); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s := &upstreamTLS{}
	h, err := New(events.PodRef{Namespace: "default", Name: "web-0"}, nc, s, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	anchor := testkit.NewCA(t, "anchor", nil, time.Now(), time.Hour).PEM()
	notAny, _ := anypb.New(wrapperspb.String("x"))
	tests := []struct {
		name      string
		res       []*anypb.Any
		wantErr   bool
		wantRoots int // -1: nothing published
		tlsCalls  int // cumulative
	}{
		{"anchors published and applied", []*anypb.Any{pc(t, anchor, anchor)}, false, 1, 1},
		{"repeat published, not re-applied", []*anypb.Any{pc(t, anchor)}, false, 1, 1},
		{"leaf certificate rejected", []*anypb.Any{pc(t, testkit.SelfSigned(t, testkit.Spec{}).PEM())}, true, -1, 1},
		{"garbage rejected", []*anypb.Any{pc(t, "-----BEGIN CERTIFICATE-----\nAA\n-----END CERTIFICATE-----\n")}, true, -1, 1},
		{"wrong type rejected", []*anypb.Any{notAny}, true, -1, 1},
		{"empty set removes anchors", nil, false, 0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := h.Handle(context.Background(), tt.res)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			if tt.wantRoots < 0 {
				select {
				case m := <-got:
					t.Fatalf("published %s after a rejected config", m.Data)
				case <-time.After(50 * time.Millisecond):
				}
			} else {
				select {
				case m := <-got:
					ev, _, err := events.Decode[events.TrustAnchors](m)
					if err != nil || ev.Pod != (events.PodRef{Namespace: "default", Name: "web-0"}) || len(ev.Roots) != tt.wantRoots {
						t.Fatalf("event %+v, %v", ev, err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("nothing published")
				}
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.calls != tt.tlsCalls {
				t.Fatalf("upstream tls given anchors %d times, want %d", s.calls, tt.tlsCalls)
			}
		})
	}
}
