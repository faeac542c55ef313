package faultcheck

import (
	"bytes"
	"crypto/x509"
)

// RotationChains tells apart the chains a pod serves through a root rotation to a
// new key (docs/rotation.md): which phase's sign reply a served chain is.
type RotationChains struct {
	Old, New *x509.Certificate // the roots before and after
}

// The shapes of a served chain, the phase whose sign reply it is.
const (
	ShapeUnknown  = -1 // none of the below
	ShapeOldKey   = 0  // leaf of the old key, old root
	ShapeCrossOld = 1  // leaf of the new key, cross, old root
	ShapeCrossNew = 2  // leaf of the new key, cross, new root
	ShapeNewRoot  = 3  // leaf of the new key, new root
)

// IsCross reports whether c is the cross certificate: the new root's key certified
// by the old root.
func (r RotationChains) IsCross(c *x509.Certificate) bool {
	return !c.Equal(r.New) && !c.Equal(r.Old) && bytes.Equal(c.RawSubjectPublicKeyInfo, r.New.RawSubjectPublicKeyInfo) &&
		c.CheckSignatureFrom(r.Old) == nil
}

// Shape is which phase's sign reply chain (leaf first, as served) is.
func (r RotationChains) Shape(chain []*x509.Certificate) int {
	if len(chain) < 2 {
		return ShapeUnknown
	}
	leaf, above := chain[0], chain[1:]
	switch {
	case leaf.CheckSignatureFrom(r.Old) == nil:
		if len(above) == 1 && above[0].Equal(r.Old) {
			return ShapeOldKey
		}
	case leaf.CheckSignatureFrom(r.New) != nil:
	case len(above) == 1 && above[0].Equal(r.New):
		return ShapeNewRoot
	case len(above) == 2 && r.IsCross(above[0]) && above[1].Equal(r.Old):
		return ShapeCrossOld
	case len(above) == 2 && r.IsCross(above[0]) && above[1].Equal(r.New):
		return ShapeCrossNew
	}
	return ShapeUnknown
}

// ReachesOld reports whether chain verifies under the old root alone by its shape:
// a leaf of the old key, or one followed by the cross certificate.
func (r RotationChains) ReachesOld(chain []*x509.Certificate) bool {
	s := r.Shape(chain)
	return s == ShapeOldKey || s == ShapeCrossOld || s == ShapeCrossNew
}
