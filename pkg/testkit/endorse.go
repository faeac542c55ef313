package testkit

import (
	"crypto"
	"testing"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// Endorse signs the bundle (trustDomain, gen, roots) with each key, as the signer
// vouches for a bundle in trust.changed and bundle replies (events.EndorsedBytes).
func Endorse(t testing.TB, trustDomain string, gen uint64, roots []string, keys ...crypto.Signer) []events.Endorsement {
	t.Helper()
	msg, err := events.EndorsedBytes(trustDomain, gen, roots)
	if err != nil {
		t.Fatal(err)
	}
	var out []events.Endorsement
	for _, k := range keys {
		id, sig, err := pki.Endorse(k, msg)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, events.Endorsement{KeyID: id, Signature: sig})
	}
	return out
}
