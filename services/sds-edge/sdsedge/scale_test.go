package sdsedge_test

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/testkit"
)

func TestThousandConcurrentStreams(t *testing.T) {
	const conns, perConn = 10, 100
	v := newEnv(t)
	p := v.startPod(podOpt{})
	ccs := make([]*grpc.ClientConn, conns)
	for i := range ccs {
		ccs[i] = p.dial(t)
	}
	streams := make([]*sdsclient.Stream, 0, conns*perConn)
	for i := 0; i < conns*perConn; i++ {
		st, err := sdsclient.Open(context.Background(), ccs[i%conns], "node", "default")
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		streams = append(streams, st)
	}
	serials := func() map[string]int {
		var mu sync.Mutex
		got := map[string]int{}
		var wg sync.WaitGroup
		for _, st := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				u, err := st.Recv()
				if err != nil {
					t.Error(err)
					return
				}
				c, err := pki.ParseCertsPEM(u.Secrets["default"].CertChain)
				if err != nil || len(c) == 0 {
					t.Error("no certificate")
					return
				}
				mu.Lock()
				got[pki.SerialHex(c[0])]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		return got
	}
	first := serials()
	if len(first) != 1 || t.Failed() {
		t.Fatalf("first responses: %v", first)
	}
	testkit.Eventually(t, "1000 streams counted", func() bool { return p.metric(t, "meshagent_sds_edge_sds_connections") == conns*perConn })
	var old string
	for s := range first {
		old = s
	}
	renew(t, v.nc, old)
	second := serials()
	if len(second) != 1 || second[old] != 0 || t.Failed() {
		t.Fatalf("after renewal: %v", second)
	}
	for _, n := range second {
		if n != conns*perConn {
			t.Fatalf("%d of %d streams got the new certificate", n, conns*perConn)
		}
	}
}
