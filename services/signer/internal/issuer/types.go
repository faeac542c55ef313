package issuer

import (
	"crypto/x509"
	"fmt"
	"net/url"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/signer/internal/ca"
)

// Transports, as cert.issued and the metrics name them.
const (
	TransportNATS = "nats"
	TransportGRPC = "grpc"
)

// DefaultResource is the only SDS resource name the CA issues certificates for.
const DefaultResource = "default"

// Via is what the transport itself proved about a request, beside what the
// request says (events.SignRequest, the one request type from sds-edge to here).
type Via struct {
	Transport string // TransportNATS or TransportGRPC
	// PeerChain is the mTLS client chain; the handshake proved its key. It is the
	// credential when the request carries no token.
	PeerChain []*x509.Certificate
	// BusPod is the pod the bus vouches for: the pod sign subject the request came
	// on, which NATS permissions let only that pod (namespace and name) publish to.
	BusPod events.PodRef
	// BusNode is the node the request came through (a node sign subject,
	// events.NodeFromSignSubject), which NATS lets only that node's leaf
	// connection publish below. The request's token must bind its pod to it.
	BusNode string
	// Impersonate is the identity the caller asks for instead of its own (Istio's
	// ImpersonatedIdentity request metadata): only a trusted node agent gets it.
	Impersonate string
	// BusID is the identity the bus vouches for: the identity sign subject the
	// request came on (events.IdentityFromSignSubject), which only a connection the
	// auth callout admitted with a token proving that identity may publish on. When
	// set it is the credential: no token is verified (the callout did, once per
	// connection), the CSR is still checked and the TTL still bounded.
	BusID *url.URL
}

// SourceBus is cert.issued's auth_source for a request authenticated by its identity
// sign subject (Via.BusID).
const SourceBus = "bus"

// Result is an issued certificate.
type Result struct {
	Leaf  *x509.Certificate
	Chain []string // leaf first, root last
	Roots []string // the whole trust bundle
	// Generation and Endorsements are those of the bundle the leaf was signed with.
	Generation   uint64
	Endorsements []events.Endorsement
	// Signing is the material that signed the leaf (its Chain follows the leaf);
	// Bundle the one whose trust bundle, generation and endorsements the reply
	// carries. They differ for a named signer.
	Signing, Bundle *ca.Material
	// Signer is, for a named signer's leaf, that signer's roots endorsed by the
	// mesh CA (Bundle): what lets the pod accept a chain ending at them.
	Signer *events.SignerRoots
}

// Error is a request error with a code from events (CodeInvalidArgument, ...).
type Error struct {
	Code string
	Msg  string
}

func (e *Error) Error() string { return e.Code + ": " + e.Msg }

func errf(code, format string, a ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, a...)}
}
