package bustest

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// RequireHubLeafListener fails t unless opts (a hub's configuration, as
// nats-server's own loader read it) listens for the node tier's leaf connections
// on 7422 in TLS, advertises nothing, and leaves their authentication to the
// auth callout: a leafnodes block with users, an nkey or an account of its own
// would admit node agents without the callout ever seeing them.
func RequireHubLeafListener(t testing.TB, opts *server.Options) {
	t.Helper()
	l := opts.LeafNode
	if l.Port != 7422 || l.TLSConfig == nil || !l.NoAdvertise || len(l.Remotes) != 0 {
		t.Errorf("leafnodes: port %d, TLS %v, no_advertise %v, %d remotes", l.Port, l.TLSConfig != nil, l.NoAdvertise, len(l.Remotes))
	}
	if l.Username != "" || l.Nkey != "" || len(l.Users) != 0 || l.Account != "" {
		t.Errorf("leafnodes authenticate on their own (user %q, nkey %q, %d users, account %q): the callout never sees them", l.Username, l.Nkey, len(l.Users), l.Account)
	}
	if opts.AuthCallout == nil || opts.AuthCallout.Account == "" {
		t.Errorf("no auth callout in the included role table: %+v", opts.AuthCallout)
	}
}
