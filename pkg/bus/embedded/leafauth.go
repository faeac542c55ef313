package embedded

import (
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/nats-io/nats-server/v2/server"
)

// LeafClient is what a client of a node's leaf server presented when it connected.
type LeafClient struct {
	Token  string // the CONNECT's auth_token: a pod's service-account token
	User   string // the CONNECT's user name, if any
	Remote net.Addr
}

// LeafUser is what a leaf server admits a client as: its name (in the server's
// monitoring and events), its permissions in the mesh account, and when the
// server ends its connection.
type LeafUser struct {
	Name        string
	Permissions policy.Permissions
	Expires     time.Time
}

// LeafAdmit decides one client connection of a leaf server: the user it is
// admitted as, or why not.
type LeafAdmit func(LeafClient) (LeafUser, error)

// leafAuth is a leaf server's client authentication: nats-server's custom
// authentication hook (Options.CustomClientAuthentication), run on the
// connecting client's own goroutine when its CONNECT arrives. The node agent
// embeds its leaf server, so it admits a pod without an auth callout: no
// per-connection user key, no request and response JWTs to sign and verify, no
// queue a storm can overflow, no answer that arrives after the server stopped
// waiting. Measured in docs/scale.md ("Admission inside the leaf server").
// nats-server still enforces the permissions it registers.
type leafAuth struct {
	admit LeafAdmit
	clk   clock.Clock
	srv   atomic.Pointer[server.Server]
}

var _ server.Authentication = (*leafAuth)(nil)

// Check admits c as admit says, in the mesh account the leaf binds to the hub.
func (a *leafAuth) Check(c server.ClientAuthentication) bool {
	if c.Kind() != server.CLIENT {
		return false
	}
	s := a.srv.Load()
	if s == nil {
		return false
	}
	u, err := a.admit(LeafClient{Token: c.GetOpts().Token, User: c.GetOpts().Username, Remote: c.RemoteAddress()})
	if err != nil {
		return false
	}
	if !u.Expires.After(a.clk.Now()) {
		return false
	}
	acc, err := s.LookupAccount(policy.AccountMesh)
	if err != nil {
		return false
	}
	c.RegisterUser(&server.User{Username: u.Name, Permissions: serverPermissions(u.Permissions), Account: acc, ConnectionDeadline: u.Expires})
	return true
}

// serverPermissions are p as nats-server holds a configured user's: allowed
// subjects only, everything else denied.
func serverPermissions(p policy.Permissions) *server.Permissions {
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: append([]string{}, p.Publish...)},
		Subscribe: &server.SubjectPermission{Allow: append([]string{}, p.Subscribe...)},
	}
	if p.Responses {
		sp.Response = &server.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	}
	return sp
}

var errNoAdmit = errors.New("embedded nats: leaf: no Admit: a leaf server must admit its clients")
