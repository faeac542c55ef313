package bus

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// DefaultURL is where services look for NATS when nothing is configured.
const DefaultURL = nats.DefaultURL

// Config says how to reach the bus and who to be on it.
type Config struct {
	URL       string // comma-separated server URLs
	CredsFile string // NATS .creds file (JWT + nkey seed)
	NKeyFile  string // nkey seed file of a service's user (pkg/bus/policy roles)
	// TokenFile holds the token sent as the connect token: a pod's service-account
	// token, checked by the auth callout. Re-read at every (re)connect, so a
	// refreshed token is what a pod reconnects with when its bus user expires.
	TokenFile string
	TLS       TLSConfig
	Name      string // connection name, shown in server monitoring
	// InboxPrefix is the role's reply-subject prefix (policy.Inbox): on a secured
	// bus a role may subscribe only below its own. Empty: nats' _INBOX.
	InboxPrefix string
	// Pod is the pod this connection claims to be (AsPod), sent as the connect user
	// name: the auth callout refuses a credential (token or certificate) that proves
	// another pod. Empty: no claim.
	Pod string
	// ConnectWait is how long Connect keeps trying the first connection; zero:
	// until ctx ends (a pod waits as long as its restart policy lets it, serving
	// its health endpoints meanwhile). Once connected, the client reconnects forever.
	ConnectWait time.Duration
	// Waiting, set in code (not a flag), hears each failed first-connection
	// attempt's error while Connect keeps trying, for a readiness check that says
	// what the process waits for.
	Waiting func(err error)
	// Background makes Connect return at once with a connection that keeps
	// trying in the background (nats' RetryOnFailedConnect), for a service that
	// can do its work without the bus for a while (sds-edge with a gRPC CA).
	// Subscriptions made meanwhile take effect on connect; the reconnect handler
	// runs on the first successful connect. ConnectWait is then unused.
	Background bool
	// Clock, set in code (not a flag), times the waits between first-connection
	// attempts and the reports of them; nil: the wall clock.
	Clock clock.Clock
	// NodeLocal, set in code, says URL is the pod's own node agent (the node
	// tier, ViaNodeEnv set): pings every NodeLocalPingInterval, not PingInterval,
	// and waits NodeLocalConnectTimeout for a connection, not ConnectTimeout.
	NodeLocal bool
}

// ViaNodeEnv names the node whose agent a pod's NATS_URL reaches (sds-edge's
// -bus-via-node, whose flag names it literally: deploy/kubernetes's checks read
// the flag tables); every role of such a pod connects as NodeLocal.
const ViaNodeEnv = "BUS_VIA_NODE"

// TLSConfig enables TLS to the bus when CAFile or CertFile is set.
type TLSConfig struct {
	CAFile   string
	CertFile string
	KeyFile  string
	// ClientCert, set in code (not a flag), gives the certificate to present when a
	// TLS server asks for one, called at every handshake: a pod presents its current
	// mesh certificate, so that after a renewal its next connection presents the new
	// one, and the auth callout can admit it without a token. It returning nil (or
	// an error) presents none. Not with CertFile.
	ClientCert func() (*tls.Certificate, error)
}

// Bind registers the bus flags (and their env vars) on fs.
func (c *Config) Bind(fs *flagenv.Set) {
	fs.String(&c.URL, "nats-url", "NATS_URL", DefaultURL, "NATS server URL(s), comma-separated")
	fs.String(&c.CredsFile, "nats-creds", "NATS_CREDS", "", "NATS credentials file (JWT + nkey seed, decentralized auth)")
	fs.String(&c.NKeyFile, "nats-nkey", "NATS_NKEY", "", "nkey seed file of this service's bus user (mode 0600, or 0440 with a group of this process)")
	fs.String(&c.TokenFile, "nats-token-file", "NATS_TOKEN_FILE", c.TokenFile, "file with the token to connect with (a pod's service-account token); re-read at every reconnect")
	fs.String(&c.TLS.CAFile, "nats-tls-ca", "NATS_TLS_CA", "", "CA bundle to verify the NATS server")
	fs.String(&c.TLS.CertFile, "nats-tls-cert", "NATS_TLS_CERT", "", "client certificate for NATS mTLS")
	fs.String(&c.TLS.KeyFile, "nats-tls-key", "NATS_TLS_KEY", "", "client key for NATS mTLS")
	fs.Duration(&c.ConnectWait, "nats-connect-wait", "NATS_CONNECT_WAIT", c.ConnectWait, "how long to keep trying the first connection to NATS at start (0: until stopped)")
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if strings.TrimSpace(c.URL) == "" {
		errs = append(errs, errors.New("-nats-url: required"))
	}
	n := 0
	for _, f := range []string{c.CredsFile, c.NKeyFile, c.TokenFile} {
		if f != "" {
			n++
		}
	}
	if n > 1 {
		errs = append(errs, errors.New("-nats-creds, -nats-nkey, -nats-token-file: set at most one"))
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		errs = append(errs, errors.New("-nats-tls-cert and -nats-tls-key: set both or neither"))
	}
	if c.TLS.CertFile != "" && c.TLS.ClientCert != nil {
		errs = append(errs, errors.New("-nats-tls-cert: not with a client certificate given in code (the pod's own)"))
	}
	if c.ConnectWait < 0 {
		errs = append(errs, errors.New("-nats-connect-wait: must not be negative"))
	}
	return errors.Join(errs...)
}

// presentCert makes every TLS handshake present the certificate cert returns then
// (none when it has none). It does not turn TLS on: that stays the server's demand
// (tls_required) or the client's (-nats-tls-ca, a tls:// URL), so a plaintext bus
// is still reached in plaintext.
func presentCert(cert func() (*tls.Certificate, error), log hclog.Logger) nats.Option {
	return func(o *nats.Options) error {
		if o.TLSConfig == nil {
			o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		o.TLSConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := cert()
			if err != nil || c == nil {
				if err != nil {
					log.Debug("no client certificate to present to the bus", "error", err)
				}
				return &tls.Certificate{}, nil
			}
			return c, nil
		}
		return nil
	}
}

// authOptions turns the configured credential into connect options.
func (c Config) authOptions(log hclog.Logger) ([]nats.Option, error) {
	var opts []nats.Option
	if c.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(c.InboxPrefix))
	}
	if c.Pod != "" && c.CredsFile == "" && c.NKeyFile == "" {
		opts = append(opts, nats.UserInfo(c.Pod, ""))
	}
	switch {
	case c.CredsFile != "":
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	case c.NKeyFile != "":
		kp, err := policy.ReadSeed(c.NKeyFile, nkeys.PrefixByteUser)
		if err != nil {
			return nil, fmt.Errorf("-nats-nkey: %w", err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("-nats-nkey: %w", err)
		}
		opts = append(opts, nats.Nkey(pub, kp.Sign))
	case c.TokenFile != "":
		if _, err := readToken(c.TokenFile); err != nil {
			return nil, fmt.Errorf("-nats-token-file: %w", err)
		}
		path := c.TokenFile
		opts = append(opts, nats.TokenHandler(func() string {
			tok, err := readToken(path)
			if err != nil {
				log.Error("cannot read bus token", "file", path, "error", err)
			}
			return tok
		}))
	}
	return opts, nil
}

// readToken reads a token file (a projected service-account token), trimmed.
func readToken(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return tok, nil
}
