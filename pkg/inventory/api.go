package inventory

import "time"

// The operator service's inventory API (GET /api/inventory): one page of the
// inventory, filtered, sorted and cut by the operator's index, with the whole
// fleet's counts. These types are the contract between the operator and its
// readers (the dashboard, meshctl).

// APIParams are the parameters /api/inventory takes; any other is refused (400).
//
//	ns      exact namespace of the holder
//	pod     start of the pod's name, or of "<namespace>/<name>" when it holds a '/'
//	        (for a certificate without a pod, a substring of its SPIFFE ID)
//	root    prefix of the root's fingerprint
//	expiry  "expired", or a duration: expiring within it
//	state   current, down, overdue (renewal overdue or expired), silent (told to
//	        renew again with no new certificate: gone, or failing)
//	sort    expiry (default), pod, namespace, root; order asc (default) or desc
//	serial  start of the serial (hex, at least 6 digits: meshctl inspect's)
//	offset, limit (1 to 1000, default 100); bench=1 includes meshctl bench's load
var APIParams = []string{"ns", "pod", "root", "serial", "expiry", "state", "sort", "order", "offset", "limit", "bench"}

// Counts are the whole inventory's figures (not the page's), for the summary.
type Counts struct {
	Certificates int            `json:"certificates"` // current: not down, not bench
	Pods         int            `json:"pods"`         // pods holding a current certificate
	Down         int            `json:"down"`         // certificates of pods that said they stopped
	DownPods     int            `json:"down_pods"`    // pods that said they stopped and hold no current certificate
	ExpireIn1h   int            `json:"expire_within_1h"`
	Expired      int            `json:"expired"`
	Overdue      int            `json:"renewal_overdue"` // current, past OverdueRatio of their life, not expired
	RenewIn1h    int            `json:"renew_within_1h"` // due for renewal (half their life) within the hour, not expired
	Silent       int            `json:"silent"`          // holders told to renew again with no new certificate
	Bench        int            `json:"bench_hidden"`
	ByNamespace  map[string]int `json:"namespaces"`
	ByRoot       map[string]int `json:"roots"` // current certificates by root fingerprint
	Named        map[string]int `json:"named_signers,omitempty"`
	// MeshRoots are the current certificates of the mesh CA (no named signer) by
	// root: one under a root the bundle does not hold needs attention.
	MeshRoots map[string]int `json:"mesh_roots,omitempty"`
	// LivePodRoots are the pods' certificates of the mesh CA that are neither
	// down, expired nor silent (Cert.Silent), by root: the pods a root rotation
	// waits for (meshctl rotate root -wait).
	LivePodRoots map[string]int `json:"live_pod_roots,omitempty"`
	// LastHour is what the fleet did in the last hour, from the counters the
	// keepers keep in the inventory (no history read).
	LastHour Tally `json:"last_hour"`
}

// Page is the answer of /api/
type Page struct {
	Now         time.Time `json:"now"`
	Total       int       `json:"total"` // certificates matching the filter
	Offset      int       `json:"offset"`
	Limit       int       `json:"limit"`
	Certs       []Cert    `json:"certificates"`
	Counts      Counts    `json:"counts"`
	BenchHidden int       `json:"bench_hidden"`
	Trust       *Trust    `json:"trust,omitempty"`
	Skipped     []Skipped `json:"skipped,omitempty"`
	// Loading is set while the replica catches up with the bucket: the page
	// holds what it has read so far.
	Loading *Loading `json:"loading,omitempty"`
}

// Loading is how far a replica that is catching up with the bucket is (absent
// from a page once it has).
type Loading struct {
	Loaded    int    `json:"loaded"`
	Remaining uint64 `json:"remaining"`
}
