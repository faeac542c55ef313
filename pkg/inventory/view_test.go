package inventory_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/inventory"
)

// TestViewFollowsPutsAndDeletes: a view changes one record at a time as a watch
// delivers them, and its snapshot is the one Decode builds from the same values.
func TestViewFollowsPutsAndDeletes(t *testing.T) {
	now := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	rec := func(pod, serial string, left time.Duration) []byte {
		b, _ := json.Marshal(inventory.Cert{Pod: pod, Serial: serial, SPIFFEID: "spiffe://td/ns/a/sa/b", NotBefore: now, NotAfter: now.Add(left)})
		return b
	}
	v := inventory.NewView()
	v.Put("pod.a.1", rec("a/one", "01", 2*time.Hour))
	v.Put("pod.a.2", rec("a/two", "02", time.Hour))
	if s := v.Snapshot(); len(s.Certs) != 2 || s.Certs[0].Serial != "02" {
		t.Fatalf("by expiry: %+v", s.Certs)
	}
	// A renewal replaces its key's record; a bad value replaces it too, as skipped.
	v.Put("pod.a.1", rec("a/one", "03", 30*time.Minute))
	if !v.Put("pod.a.2", []byte("not json")) {
		t.Fatal("a bad record not reported")
	}
	s := v.Snapshot()
	if len(s.Certs) != 1 || s.Certs[0].Serial != "03" || len(s.Skipped) != 1 || s.Skipped[0].Key != "pod.a.2" {
		t.Fatalf("after a renewal and a bad record: %+v", s)
	}
	v.Put(inventory.TrustKey, []byte(`{"trust_domain":"td","generation":2}`))
	v.Delete("pod.a.2")
	v.Delete("pod.a.1")
	s = v.Snapshot()
	if len(s.Certs) != 0 || len(s.Skipped) != 0 || s.Trust == nil || s.Trust.Generation != 2 {
		t.Fatalf("after deletes: %+v", s)
	}
	if c, k := v.Len(); c != 0 || k != 0 {
		t.Fatalf("len %d %d", c, k)
	}
	d := inventory.Decode(map[string][]byte{"pod.a.1": rec("a/one", "01", time.Hour), "pod.b.1": []byte("{}")})
	if len(d.Certs) != 1 || len(d.Skipped) != 1 {
		t.Fatalf("decode: %+v", d)
	}
}

// TestNamedSignerIsNotABrokenChain: a certificate of a named signer ends at that
// signer's root, which is not in the mesh's bundle by design: no "root not in
// bundle" for it, while a mesh certificate under an unknown root still gets one.
func TestNamedSignerIsNotABrokenChain(t *testing.T) {
	now := time.Now()
	trust := &inventory.Trust{Roots: []inventory.Root{{Fingerprint: "mesh"}}}
	rec, _ := inventory.Apply(nil, events.CertIssued{Serial: "01", SPIFFEID: "spiffe://td/ns/default/sa/web", NotBefore: now, NotAfter: now.Add(time.Hour),
		Pod: events.PodRef{Namespace: "default", Name: "web"}, RootFingerprint: "partner-root", CertSigner: "partner"}, events.Meta{Time: now})
	c := *rec
	if c.CertSigner != "partner" {
		t.Fatalf("record %+v does not name its signer", c)
	}
	if w := c.Warnings(now, trust); len(w) != 0 {
		t.Fatalf("named signer's certificate: %v", w)
	}
	c.CertSigner = ""
	if w := c.Warnings(now, trust); len(w) != 1 || w[0] != "root not in bundle" {
		t.Fatalf("mesh certificate under an unknown root: %v", w)
	}
}
