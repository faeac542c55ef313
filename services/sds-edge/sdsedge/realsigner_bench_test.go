package sdsedge_test

import (
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/devtokentest"
	"github.com/meshagent/meshagent/tests/testkit"
)

// pushSamples is how many renewals BenchmarkPushLatencyRealSigner times: a p99
// needs at least 2,000.
const pushSamples = 2000

// BenchmarkPushLatencyRealSigner: a rotator-style renew.due event published →
// the SDS client holds the new secret, with the real signer binary behind the bus
// (ES256 service-account token verified per request, cert.issued stored in
// JetStream before the reply) over TCP NATS. sds-edge runs in this process. The
// signer binary comes from MESHAGENT_BIN (make bench), else is built.
func BenchmarkPushLatencyRealSigner(b *testing.B) {
	ns := bustest.Server(b)
	// One pod renewed 2,100 times in a row: without the bound on early certificates
	// (10 a minute per pod, on by default since d57a14b) the eleventh is refused.
	iss, signer := devtokentest.StartSigner(b, ns.ClientURL(), "-instance", "push-bench", "-max-early-certs-per-minute", "0")
	tok, err := iss.MintForPod("default", "web", testPod, "", 2*time.Hour, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	root := testkit.ShortDir(b)
	writeToken(b, root, tok)
	v := &env{t: b, ns: ns, nc: bustest.Conn(b, ns)}
	p := v.startPod(podOpt{root: root, noTok: true})
	st := p.open(b, p.dial(b), "default")
	cur := recv(b, st).Secrets["default"]
	if got := leafOf(b, cur).URIs; len(got) != 1 || got[0].String() != "spiffe://cluster.local/ns/default/sa/web" {
		b.Fatalf("first certificate names %v\nsigner log:\n%s", got, signer.Logs.String())
	}
	lat := make([]time.Duration, 0, pushSamples)
	for range 100 + pushSamples { // the first 100 warm up and are not counted
		serial := pki.SerialHex(leafOf(b, cur))
		start := time.Now()
		renew(b, v.nc, serial)
		cur = recv(b, st).Secrets["default"]
		if pki.SerialHex(leafOf(b, cur)) == serial {
			b.Fatal("renewal pushed the same certificate")
		}
		lat = append(lat, time.Since(start))
	}
	report(b, "push", lat[100:])
	b.ReportMetric(0, "ns/op")
}
