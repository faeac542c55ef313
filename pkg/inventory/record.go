// Package inventory is the fleet's certificate inventory: which pod holds which
// certificate (SPIFFE ID, serial, validity, issuing signer, root, the SDS streams it
// was pushed to) and the roots of the trust bundle, kept current from the public
// events by a Keeper (a durable consumer writing one key per certificate holder into
// the JetStream bucket meshagent_inventory) and read by anyone with the audit role
// (Read: the bucket's stream, read by sequence). Folding an event into a record is
// idempotent and order-independent, so several keepers may share the durable and an
// event delivered twice changes nothing. Beside the records the bucket keeps the
// fleet's counts of the last two hours, by minute (counters.go), so that no reader
// replays the history to count.
package inventory

import (
	"crypto/x509"
	"encoding/hex"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// Cert is what the inventory knows of one holder's (pod, resource) current certificate.
type Cert struct {
	Pod       string    `json:"pod,omitempty"` // "<namespace>/<name>" (events.PodRef.String)
	Resource  string    `json:"resource"`
	SPIFFEID  string    `json:"spiffe_id"`
	Serial    string    `json:"serial"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	Signer    string    `json:"signer"`
	Root      string    `json:"root"` // SHA-256 fingerprint of the root the chain ends at
	// CertSigner is the named signer whose own CA signed ("" : the mesh CA): its
	// root is that signer's, not one of the bundle's, by design.
	CertSigner   string    `json:"cert_signer,omitempty"`
	KeyAlgorithm string    `json:"key_algorithm,omitempty"`
	Issued       time.Time `json:"issued,omitzero"`       // when cert.issued was published
	Renewals     int       `json:"renewals"`              // certificates seen for this holder before this one
	Chain        []string  `json:"cert_chain,omitempty"`  // leaf first, root excluded (public)
	Streams      int       `json:"sds_streams"`           // SDS streams the serial was last pushed to
	Pushed       time.Time `json:"pushed,omitzero"`       // last sds.pushed of this serial
	Version      string    `json:"sds_version,omitempty"` // the SDS version Envoy was given
	LastRenewal  string    `json:"last_renewal,omitempty"`
	RenewSent    time.Time `json:"renew_sent,omitzero"`
	Down         bool      `json:"down,omitempty"` // the pod said it stopped
	DownAt       time.Time `json:"down_at,omitzero"`
	// Served is the serial the pod last pushed to Envoy, and ServedUntil its
	// NotAfter: an older certificate than Serial when the pod did not take the
	// newer ones (it refused them), which is what it serves all the same.
	Served      string    `json:"served_serial,omitempty"`
	ServedUntil time.Time `json:"served_not_after,omitzero"`
}

// Namespace is the namespace of c's holder: its pod's, else its SPIFFE ID's.
func (c Cert) Namespace() string {
	if ns, _, ok := strings.Cut(c.Pod, "/"); ok {
		return ns
	}
	return events.NamespaceOfID(c.SPIFFEID)
}

// Bench reports whether c is meshctl bench's (namespace events.BenchNamespace).
func (c Cert) Bench() bool { return c.Namespace() == events.BenchNamespace }

// WithoutBench is s less meshctl bench's certificates, and how many those were:
// what fleet counts show unless asked for the load too.
func (s Snapshot) WithoutBench() (Snapshot, int) {
	out := s
	out.Certs = make([]Cert, 0, len(s.Certs))
	for _, c := range s.Certs {
		if !c.Bench() {
			out.Certs = append(out.Certs, c)
		}
	}
	return out, len(s.Certs) - len(out.Certs)
}

// Trust is the trust bundle the inventory last heard of.
type Trust struct {
	TrustDomain string    `json:"trust_domain"`
	Generation  uint64    `json:"generation"`
	Reason      string    `json:"reason"`
	Changed     time.Time `json:"changed"`
	Roots       []Root    `json:"roots"`
}

// Root is one root of the bundle.
type Root struct {
	Fingerprint string    `json:"fingerprint"`
	Subject     string    `json:"subject"`
	NotBefore   time.Time `json:"not_before"`
	NotAfter    time.Time `json:"not_after"`
	PEM         string    `json:"pem"`
}

// TrustKey is the key of the trust record.
const TrustKey = "trust"

// CertKey is the key of a holder's record: "pod.<namespace>.<name in hex>.<resource
// in hex>" (a pod is namespace + name: the same name in another namespace is
// another holder), or for a certificate without a pod (an Istio agent over gRPC)
// "id.<SPIFFE ID in hex>".
func CertKey(pod events.PodRef, resource, spiffeID string) string {
	if resource == "" {
		resource = "default"
	}
	if pod.IsZero() {
		return "id." + hex.EncodeToString([]byte(spiffeID))
	}
	return podPrefix(pod) + hex.EncodeToString([]byte(resource))
}

// podPrefix starts the keys of every record of pod. The name is hex: a pod name
// may hold '.', which would make one pod's prefix another's ("a." of "a.b").
func podPrefix(pod events.PodRef) string {
	return "pod." + pod.Namespace + "." + hex.EncodeToString([]byte(pod.Name)) + "."
}

// KeyOf is the key an event updates, "" for events the inventory does not keep.
// A pod.down updates every resource of the pod: KeyOf returns the pod's key prefix
// (ending in '.') for it.
func KeyOf(p events.Payload) string {
	switch e := p.(type) {
	case events.CertIssued:
		return CertKey(e.Pod, e.Resource, e.SPIFFEID)
	case events.SecretPushed:
		if e.Serial == "" || e.Resource == "ROOTCA" {
			return ""
		}
		return CertKey(e.Pod, e.Resource, "")
	case events.RenewDue:
		return CertKey(e.Pod, e.Resource, "")
	case events.PodDown:
		return podPrefix(e.Pod)
	case events.TrustChanged:
		return TrustKey
	}
	return ""
}

// newer reports whether a certificate (serial s, notBefore nb, announced at at)
// supersedes c's. Two renewals within a second have the same notBefore (X.509 has
// whole seconds), so the time of their cert.issued decides, then the serial.
func (c *Cert) newer(nb, at time.Time, s string) bool {
	switch {
	case c.Serial == "":
		return true
	case !nb.Equal(c.NotBefore):
		return nb.After(c.NotBefore)
	case !at.Equal(c.Issued):
		return at.After(c.Issued)
	}
	return s > c.Serial
}

// Apply folds one event into c (nil: no record yet) and returns the new record and
// whether anything changed. Applying the same event twice, or an older one after a
// newer, changes nothing.
func Apply(c *Cert, p events.Payload, meta events.Meta) (*Cert, bool) {
	cur := Cert{}
	if c != nil {
		cur = *c
	}
	switch e := p.(type) {
	case events.CertIssued:
		if !cur.newer(e.NotBefore, meta.Time, e.Serial) {
			return c, false
		}
		renewals := cur.Renewals
		if cur.Serial != "" {
			renewals++
		}
		res := e.Resource
		if res == "" {
			res = "default"
		}
		return &Cert{Pod: e.Pod.String(), Resource: res, SPIFFEID: e.SPIFFEID, Serial: e.Serial, NotBefore: e.NotBefore,
			NotAfter: e.NotAfter, Signer: e.Signer, Root: e.RootFingerprint, CertSigner: e.CertSigner, KeyAlgorithm: e.KeyAlgorithm,
			Issued: meta.Time, Renewals: renewals, Chain: e.CertChain,
			// The renewal that brought it (if any) stays on the record, and what the
			// pod serves until it pushes the new one.
			LastRenewal: cur.LastRenewal, RenewSent: cur.RenewSent, Served: cur.Served, ServedUntil: cur.ServedUntil}, true
	case events.SecretPushed:
		if cur.Serial == "" || !strings.EqualFold(cur.Serial, e.Serial) || meta.Time.Before(cur.Pushed) ||
			(meta.Time.Equal(cur.Pushed) && cur.Streams == e.Streams && cur.Version == e.Version) {
			return c, false
		}
		cur.Streams, cur.Pushed, cur.Version = e.Streams, meta.Time, e.Version
		cur.Served, cur.ServedUntil = cur.Serial, cur.NotAfter
		if cur.Down && meta.Time.After(cur.DownAt) {
			cur.Down = false
		}
		return &cur, true
	case events.RenewDue:
		if c == nil || !meta.Time.After(cur.RenewSent) {
			return c, false
		}
		cur.LastRenewal, cur.RenewSent = e.Reason, meta.Time
		return &cur, true
	case events.PodDown:
		if c == nil || cur.Down || !meta.Time.After(cur.Pushed) || !meta.Time.After(cur.Issued) {
			return c, false
		}
		cur.Down, cur.DownAt = true, meta.Time
		return &cur, true
	}
	return c, false
}

// ApplyTrust folds a trust.changed into t: a newer generation replaces it.
func ApplyTrust(t *Trust, e events.TrustChanged, meta events.Meta) (*Trust, bool) {
	if t != nil && e.Generation <= t.Generation && t.Generation != 0 {
		return t, false
	}
	out := &Trust{TrustDomain: e.TrustDomain, Generation: e.Generation, Reason: e.Reason, Changed: meta.Time}
	for _, p := range e.Roots {
		cs, err := pki.ParseCertsPEM([]byte(p))
		if err != nil || len(cs) == 0 {
			continue
		}
		out.Roots = append(out.Roots, rootOf(cs[0], p))
	}
	return out, true
}

func rootOf(c *x509.Certificate, pem string) Root {
	return Root{Fingerprint: pki.Fingerprint(c), Subject: c.Subject.String(), NotBefore: c.NotBefore, NotAfter: c.NotAfter, PEM: pem}
}

// RootsFromPEM describes the roots of a bundle (a bundle reply, a file).
func RootsFromPEM(pems []string) []Root {
	var out []Root
	for _, p := range pems {
		cs, err := pki.ParseCertsPEM([]byte(p))
		if err != nil {
			continue
		}
		for _, c := range cs {
			out = append(out, rootOf(c, p))
		}
	}
	return out
}
