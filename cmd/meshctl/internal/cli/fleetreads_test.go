package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/pkg/inventory/fleetindex"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

// fleetSize is how many records the read-count tests seed: a whole read of the
// bucket hands over at least this many messages.
const fleetSize = 3000

// seededBus is an embedded nats-server with JetStream whose inventory bucket holds
// fleetSize records, pod default/demo-<i> each, demo-7's with a real chain under
// root; nk is a credential file for meshctl (-nats-nkey) and nc a connection.
type seededBus struct {
	srv    *server.Server
	nc     *nats.Conn
	nk     string
	root   *testkit.CA
	target inventory.Cert
}

func seedBus(t testing.TB, n int) *seededBus {
	t.Helper()
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, JetStream: true,
		StoreDir: t.TempDir(), Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	b := &seededBus{srv: s, nk: filepath.Join(t.TempDir(), "audit.nk")}
	if err := os.WriteFile(b.nk, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	b.nc, err = nats.Connect(s.ClientURL(), nats.Nkey(pub, func(n []byte) ([]byte, error) { return kp.Sign(n) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	js, _ := jetstream.New(b.nc)
	kv, err := inventory.OpenBucket(ctx, js, 1)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	b.root = testkit.NewCA(t, "meshagent root CA", nil, now.Add(-time.Hour), 24*time.Hour)
	rootPEM := string(pki.EncodeCertPEM(b.root.Cert))
	// What kv.Put publishes, without waiting for each ack: 100,000 records in seconds.
	put := func(key string, v any) {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishAsync("$KV."+policy.BucketInventory+"."+key, data); err != nil {
			t.Fatal(err)
		}
	}
	put(inventory.TrustKey, inventory.Trust{TrustDomain: "cluster.local", Generation: 1, Roots: []inventory.Root{{Fingerprint: pki.Fingerprint(b.root.Cert),
		Subject: b.root.Cert.Subject.String(), NotBefore: b.root.Cert.NotBefore, NotAfter: b.root.Cert.NotAfter, PEM: rootPEM}}})
	for i := range n {
		pod := fmt.Sprintf("default/demo-%d", i)
		c := inventory.Cert{Pod: pod, Resource: "default", SPIFFEID: "spiffe://cluster.local/ns/default/sa/demo", Serial: fmt.Sprintf("%016x", 0x5e0000+i),
			NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour), Signer: "signer-0", Root: pki.Fingerprint(b.root.Cert), Issued: now}
		if i == 7 {
			leaf := b.root.Issue(t, testkit.Spec{ID: c.SPIFFEID})
			c.Serial, c.NotBefore, c.NotAfter = pki.SerialHex(leaf.Cert), leaf.Cert.NotBefore, leaf.Cert.NotAfter
			c.Chain = []string{string(pki.EncodeCertPEM(leaf.Cert))}
			b.target = c
		}
		put(inventory.KeyOfCert(c), c)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("seeding the bucket: no acks")
	}
	if st, err := kv.Status(ctx); err != nil || st.Values() != uint64(n+1) {
		t.Fatalf("the bucket holds %v records, want %d: %v", st, n+1, err)
	}
	return b
}

// delivered is how many messages the server has handed to its clients so far.
func (b *seededBus) delivered(t testing.TB) int64 {
	t.Helper()
	v, err := b.srv.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	return v.OutMsgs
}

// operator serves the bucket's index as the operator's /api/inventory does
// (fleetindex: its query parsing and pages), counting the pages.
func (b *seededBus) operator(t testing.TB) (url string, pages *atomic.Int32) {
	t.Helper()
	ix, err := fleetindex.ReadBucket(context.Background(), b.nc)
	if err != nil {
		t.Fatal(err)
	}
	pages = &atomic.Int32{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q, err := fleetindex.ParseQuery(r.URL.Query())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		pages.Add(1)
		_ = json.NewEncoder(w).Encode(ix.Page(q, time.Now()))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, pages
}

// meshctl inspect reads one pod's records by key, and a serial through one page
// of the operator's index then its holder's record by key: the server hands it a
// few messages, not the fleetSize records of the bucket (it read the bucket whole
// before). The positive control: a whole read, as before, is seen as one.
func TestInspectReadsOnePodNotTheFleet(t *testing.T) {
	b := seedBus(t, fleetSize)
	whole := b.delivered(t)
	if _, err := inventory.Read(context.Background(), b.nc); err != nil {
		t.Fatal(err)
	}
	if n := b.delivered(t) - whole; n < fleetSize {
		t.Fatalf("a whole read counted %d messages, want at least %d: the count cannot tell", n, fleetSize)
	}
	api, pages := b.operator(t)
	for _, tc := range []struct{ name, what string }{
		{"pod", "default/demo-7"},
		{"bare pod name", "demo-7"},
		{"serial", strings.ToUpper(b.target.Serial[:10])},
	} {
		before := b.delivered(t)
		pagesBefore := pages.Load()
		out, err := run(t, "inspect", tc.what, "-nats-url", b.srv.ClientURL(), "-nats-nkey", b.nk, "-operator", api)
		if err != nil || !strings.Contains(out, "serial      "+b.target.Serial) || !strings.Contains(out, "verifies    yes") ||
			strings.Count(out, "serial      ") != 1 {
			t.Fatalf("%s: inspect %s: %v\n%s", tc.name, tc.what, err, out)
		}
		if n := b.delivered(t) - before; n > 50 {
			t.Errorf("%s: inspect was handed %d messages for one pod of %d", tc.name, n, fleetSize)
		}
		if n := pages.Load() - pagesBefore; tc.name == "serial" && n != 1 || tc.name != "serial" && n != 0 {
			t.Errorf("%s: inspect asked the operator for %d pages", tc.name, n)
		}
	}
}

// rotate root -wait follows the fleet from the operator's counts: two pages a
// look, and no read of the bucket.
func TestRotateWaitReadsCountsNotTheFleet(t *testing.T) {
	b := seedBus(t, fleetSize)
	api, pages := b.operator(t)
	before := b.delivered(t)
	var out bytes.Buffer
	env := Env{Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}
	fp := pki.Fingerprint(b.root.Cert)
	if err := followRoot(context.Background(), b.nc, &operatorAPI{base: api, timeout: 10 * time.Second}, env, fp, 30*time.Second); err != nil {
		t.Fatalf("followRoot: %v\n%s", err, out.String())
	}
	if want := fmt.Sprintf("%d/%d live pod certificate(s) under the new root", fleetSize, fleetSize); !strings.Contains(out.String(), want) {
		t.Fatalf("output lacks %q:\n%s", want, out.String())
	}
	if n := b.delivered(t) - before; n > 50 {
		t.Errorf("rotate root -wait was handed %d messages by the bus (the bucket holds %d records)", n, fleetSize)
	}
	if n := pages.Load(); n != 2 {
		t.Errorf("one look took %d pages, want 2", n)
	}
}
