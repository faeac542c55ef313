package caclient

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

// The trust bundle header (events.TrustBundleHeader) is read as one bundle of PEM
// roots, marked whole for the pod's check; none is no bundle (istiod), and a
// header that is not one well-formed bundle is an error, never half a bundle.
func TestVouchedBundleHeader(t *testing.T) {
	root := testkit.NewCA(t, "root", nil, time.Now(), time.Hour)
	rootPEM := string(pki.EncodeCertPEM(root.Cert))
	good := `{"trust_domain":"cluster.local","generation":4,"roots":[` + strconv.Quote(rootPEM) + `]}`
	b, err := vouchedBundle(metadata.Pairs(events.TrustBundleHeader, good))
	if err != nil || b == nil || !b.Whole || b.Generation != 4 || len(b.Roots) != 1 || b.TrustDomain != "cluster.local" {
		t.Fatalf("a well-formed header: %+v, %v", b, err)
	}
	if b, err := vouchedBundle(metadata.MD{}); b != nil || err != nil {
		t.Fatalf("no header: %+v, %v", b, err)
	}
	for name, md := range map[string]metadata.MD{
		"two values": metadata.Pairs(events.TrustBundleHeader, good, events.TrustBundleHeader, good),
		"not JSON":   metadata.Pairs(events.TrustBundleHeader, "{"),
		"no roots":   metadata.Pairs(events.TrustBundleHeader, `{"trust_domain":"cluster.local","generation":4}`),
		"not a PEM":  metadata.Pairs(events.TrustBundleHeader, `{"trust_domain":"cluster.local","roots":["x"]}`),
		"too large":  metadata.Pairs(events.TrustBundleHeader, good+strings.Repeat(" ", events.MaxEventSize)),
	} {
		if b, err := vouchedBundle(md); err == nil || b != nil || !strings.Contains(err.Error(), events.TrustBundleHeader) {
			t.Errorf("%s: %+v, %v", name, b, err)
		}
	}
}
