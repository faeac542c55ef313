package loadgen

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// job is the pods one process runs: the whole storm in meshctl's own process,
// or one worker's share of it (a worker reads it as JSON on its stdin).
type job struct {
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"service_account"`
	Audience       string `json:"audience"`
	IssuerDir      string `json:"issuer_dir"`
	Layout         Layout `json:"layout"`
	// Nodes are the node tier's agents, one per Layout.Nodes; pod i runs on
	// node i mod Layout.Nodes. Empty: every pod connects to NATSURL.
	Nodes   []stackfile.Node `json:"nodes,omitempty"`
	NATSURL string           `json:"nats_url"`
	TLSCA   string           `json:"tls_ca,omitempty"`
	Timeout time.Duration    `json:"timeout"`
	// Worker of Workers is this job's share (Workers 0 or 1: every pod).
	Worker  int `json:"worker"`
	Workers int `json:"workers"`
}

// owns reports whether pod i is this job's. A worker takes whole nodes (so
// that a node's pods come from one process, as from one machine), or, without
// a node tier, every Workers-th pod.
func (j job) owns(i int) bool {
	if j.Workers <= 1 {
		return true
	}
	k := i
	if j.Layout.Nodes > 0 {
		k = i % j.Layout.Nodes
	}
	return k%j.Workers == j.Worker
}

// preparePods makes the job's pods, storm-<i> for each i it owns, each with its
// own key and CSR and a token minted for it (bound to the pod, and to its node
// on the node tier) written under dir. Keys and tokens are made on every core.
func preparePods(j job, iss *devtoken.Issuer, dir string) ([]*simPod, error) {
	var idx []int
	for i := range j.Layout.Pods {
		if j.owns(i) {
			idx = append(idx, i)
		}
	}
	if j.Layout.Nodes > 0 && len(j.Nodes) != j.Layout.Nodes {
		return nil, fmt.Errorf("storm: %d nodes running for a layout of %d", len(j.Nodes), j.Layout.Nodes)
	}
	pods := make([]*simPod, len(idx))
	var (
		next     atomic.Int64
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	now := time.Now()
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for {
				k := int(next.Add(1)) - 1
				if k >= len(idx) {
					return
				}
				p, err := j.preparePod(idx[k], iss, dir, now)
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
				pods[k] = p
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return pods, nil
}

// preparePod makes pod i: on the node tier it connects to its node's agent and
// signs on its node sign subject, directly it connects to the hub and signs on
// its identity subject.
func (j job) preparePod(i int, iss *devtoken.Issuer, dir string, now time.Time) (*simPod, error) {
	ns, sa := j.Namespace, j.ServiceAccount
	p := &simPod{pod: events.PodRef{Namespace: ns, Name: fmt.Sprintf("storm-%d", i)}, url: j.NATSURL, tlsCA: j.TLSCA}
	if j.Layout.Nodes > 0 {
		n := j.Nodes[i%j.Layout.Nodes]
		p.node, p.url, p.tlsCA = n.Name, "nats://"+n.Bus, ""
	}
	var err error
	if p.token, err = iss.MintForPodOnNode(ns, sa, p.pod.Name, p.node, j.Audience, time.Hour, now); err != nil {
		return nil, err
	}
	p.file = filepath.Join(dir, p.pod.Name)
	if err := os.WriteFile(p.file, []byte(p.token), 0o600); err != nil {
		return nil, err
	}
	if p.node != "" {
		p.subject, err = events.NodeSignSubject(p.node, p.pod)
	} else {
		p.subject, err = events.IdentitySignSubject(p.pod, sa)
	}
	if err != nil {
		return nil, err
	}
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		return nil, err
	}
	csr, err := pki.NewCSR(key, "spiffe://storm.invalid/ns/"+ns+"/sa/"+sa)
	if err != nil {
		return nil, err
	}
	p.csr, p.pub = string(csr), key.Public()
	return p, nil
}

// errWrongKey is a certificate whose key is not the pod's.
var errWrongKey = errors.New("the certificate's key is not the pod's")
