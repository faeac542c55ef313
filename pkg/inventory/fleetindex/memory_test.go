package fleetindex

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/inventory"
)

// heapPerCert is the live heap the index holds per certificate record, n records
// of the shape meshctl bench sign leaves (a SPIFFE ID without a pod, a chain).
func heapPerCert(t testing.TB, n int) float64 {
	now := time.Now()
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	ix := New()
	for i := range n {
		c := inventory.Cert{SPIFFEID: fmt.Sprintf("spiffe://cluster.local/ns/perf/sa/load-%d", i), Resource: "default",
			Serial: fmt.Sprintf("%040x", i+1), NotBefore: now, NotAfter: now.Add(time.Hour), Signer: "signer-0",
			Root: strings.Repeat("ab", 32), KeyAlgorithm: "EC-P256", Issued: now,
			Chain: []string{strings.Repeat("A", 900), strings.Repeat("B", 800)}}
		b, _ := json.Marshal(c)
		ix.Put(fmt.Sprintf("id.%x", c.SPIFFEID), b)
	}
	ix.Flush()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	runtime.KeepAlive(ix)
	return float64(ms.HeapAlloc-before) / float64(n)
}

// TestMemoryIsBoundedPerCertificate: the index keeps a record without its chain
// and with one copy of the values many records share, so that 100,000
// certificates fit the operator's memory limit (docs/kubernetes.md's figures
// assume no more than 1,200 bytes each).
func TestMemoryIsBoundedPerCertificate(t *testing.T) {
	if per := heapPerCert(t, 20_000); per > 1200 {
		t.Fatalf("%.0f bytes of heap per certificate, want at most 1200", per)
	} else {
		t.Logf("%.0f bytes of heap per certificate", per)
	}
}
