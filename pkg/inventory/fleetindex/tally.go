package fleetindex

import "github.com/meshagent/meshagent/pkg/events"

// tally is the fleet's counts, kept as entries come and go: a page's summary
// costs the number of namespaces and roots, not of certificates.
type tally struct {
	current, down, bench int
	byNamespace          map[string]int
	byRoot               map[string]int
	upPods, downPods     map[string]int // certificates per pod
	named                map[string]int // current certificates by named signer
	meshRoots            map[string]int // current certificates of the mesh CA (no named signer) by root
	retrying             int            // current certificates told to renew again with no new one (silent holders)
	livePods             map[string]int // current pod certificates of the mesh CA, not retrying, by root (expired ones too)
}

func newTally() tally {
	return tally{byNamespace: map[string]int{}, byRoot: map[string]int{}, upPods: map[string]int{}, downPods: map[string]int{},
		named: map[string]int{}, meshRoots: map[string]int{}, livePods: map[string]int{}}
}

// add counts e in (d = 1) or out (d = -1).
func (t *tally) add(e *entry, d int) {
	bump := func(m map[string]int, k string) {
		if m[k] += d; m[k] == 0 {
			delete(m, k)
		}
	}
	switch {
	case e.bench:
		t.bench += d
	case e.c.Down:
		t.down += d
		if e.c.Pod != "" {
			bump(t.downPods, e.c.Pod)
		}
	default:
		t.current += d
		bump(t.byNamespace, e.ns)
		bump(t.byRoot, e.c.Root)
		if e.c.Pod != "" {
			bump(t.upPods, e.c.Pod)
		}
		if e.c.CertSigner != "" {
			bump(t.named, e.c.CertSigner)
		} else {
			bump(t.meshRoots, e.c.Root)
		}
		if e.retrying() {
			t.retrying += d
		}
		if e.livePod() {
			bump(t.livePods, e.c.Root)
		}
	}
}

// livePod reports a current pod certificate of the mesh CA whose holder is not
// retrying: one a root rotation waits for while it has not expired.
func (e *entry) livePod() bool {
	return e.c.Pod != "" && e.c.CertSigner == "" && !e.retrying()
}

// retrying reports a holder told to renew again with no new certificate since
// (inventory.Cert.Silent): a pod or VM that went away without saying so.
func (e *entry) retrying() bool {
	return e.c.LastRenewal == events.RenewRetry && e.c.RenewSent.After(e.c.Issued)
}
