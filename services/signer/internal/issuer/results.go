package issuer

import (
	"crypto/x509"
	"sync"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
)

// leafResult is the answer for leaf, signed by signing, with bundle's trust bundle,
// generation and endorsements (the same material unless a named signer signed).
func leafResult(leaf *x509.Certificate, leafPEM string, signing, bundle *ca.Material) Result {
	return Result{Leaf: leaf, Chain: append([]string{leafPEM}, signing.ChainPEMs()...), Roots: bundle.RootPEMs(),
		Generation: bundle.Generation, Endorsements: bundle.Endorsements(), Signing: signing, Bundle: bundle}
}

// meshResult is leafResult for a leaf the mesh CA's material signed.
func meshResult(leaf *x509.Certificate, leafPEM string, mat *ca.Material) Result {
	return leafResult(leaf, leafPEM, mat, mat)
}

// vouched keeps each named signer's roots as the mesh CA endorsed them, made
// again when either material changes.
type vouched struct {
	mu sync.Mutex
	by map[string]vouchedEntry // by signer name
}

type vouchedEntry struct {
	mesh, named *ca.Material
	roots       *events.SignerRoots
}

func (v *vouched) get(trustDomain, name string, mesh, named *ca.Material) (*events.SignerRoots, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if e, ok := v.by[name]; ok && e.mesh == mesh && e.named == named {
		return e.roots, nil
	}
	roots, err := mesh.EndorseSigner(trustDomain, name, named)
	if err != nil {
		return nil, err
	}
	if v.by == nil {
		v.by = map[string]vouchedEntry{}
	}
	v.by[name] = vouchedEntry{mesh: mesh, named: named, roots: roots}
	return roots, nil
}
