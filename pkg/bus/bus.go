// Package bus connects services to the NATS bus. Every service connects through
// Connect, so securing the bus (credentials, TLS) is configuration, not code.
package bus

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
}

// PingInterval is how often a connection pings the server; two unanswered pings
// end it (and start reconnecting).
const PingInterval = 5 * time.Second

// ConnectTimeout bounds one connection attempt (dial, TLS, and the server's answer
// to the credential). It is above the server's auth timeout (policy.AuthTimeout),
// so that a client waits as long as the server waits for the auth callout: never
// does the callout admit a client that has already given up.
const ConnectTimeout = 10 * time.Second

// Reconnect is the schedule of waits between reconnect attempts: a wave of
// clients that lost the bus together (a server restart, users expiring together,
// a callout shedding load) comes back spread over time instead of at once.
var Reconnect = backoff.Policy{First: 250 * time.Millisecond, Max: 4 * time.Second, Jitter: 0.75}

// waitReport is how often Connect says at INFO that it is still waiting for the bus.
const waitReport = 10 * time.Second

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

// Connect dials the bus. It retries the initial connection for up to c.ConnectWait
// (or, with c.Background, returns at once and keeps trying in the background) and
// then reconnects forever; connection changes are logged on log.
func Connect(ctx context.Context, c Config, log hclog.Logger) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(c.Name),
		nats.MaxReconnects(-1),
		nats.Timeout(ConnectTimeout),
		nats.CustomReconnectDelay(reconnectDelay),
		// A connection cut without a FIN (a partition, a network detached) looks
		// alive until pings go unanswered: with nats' default of 2 minutes a pod
		// cut off for 90 s never notices, keeps sending requests into a dead
		// socket, and does not reconnect (and retry at once) when the network is
		// back. 5 s pings, 2 unanswered: a dead connection is found in 10-15 s.
		nats.PingInterval(PingInterval),
		nats.MaxPingsOutstanding(2),
		nats.RetryOnFailedConnect(false),
		nats.DrainTimeout(5 * time.Second), // shutdown stays bounded
		// A pod's bus user expires with its token; keep reconnecting (with the token
		// file re-read) instead of giving up after the same auth error twice.
		nats.IgnoreAuthErrorAbort(),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, s *nats.Subscription, err error) {
			subj := ""
			if s != nil {
				subj = s.Subject
			}
			log.Error("nats async error", "subject", subj, "error", err)
		}),
	}
	auth, err := c.authOptions(log)
	if err != nil {
		return nil, err
	}
	opts = append(opts, auth...)
	if c.TLS.CAFile != "" {
		opts = append(opts, nats.RootCAs(c.TLS.CAFile))
	}
	if c.TLS.CertFile != "" {
		opts = append(opts, nats.ClientCert(c.TLS.CertFile, c.TLS.KeyFile))
	}
	if c.TLS.ClientCert != nil {
		opts = append(opts, presentCert(c.TLS.ClientCert, log))
	}
	if c.Background {
		// The first connect after a failed one calls the connect handler, not the
		// reconnect handler: forward it, so that callers hear of it one way.
		nc, err := nats.Connect(c.URL, append(opts, nats.RetryOnFailedConnect(true),
			nats.ConnectHandler(func(nc *nats.Conn) {
				if cb := nc.ReconnectHandler(); cb != nil {
					cb(nc)
				}
			}))...)
		if err != nil {
			return nil, fmt.Errorf("connect to nats at %s: %w", c.URL, err)
		}
		if !nc.IsConnected() {
			log.Info("nats not reachable yet, connecting in the background", "url", c.URL)
		}
		return nc, nil
	}
	began := time.Now()
	var reported time.Time
	retry := Reconnect.Start()
	for {
		nc, err := nats.Connect(c.URL, opts...)
		if err == nil {
			if !reported.IsZero() {
				log.Info("nats connected", "url", nc.ConnectedUrlRedacted(), "after", time.Since(began).Round(time.Millisecond))
			} else {
				log.Debug("nats connected", "url", nc.ConnectedUrlRedacted())
			}
			return nc, nil
		}
		if c.ConnectWait > 0 && time.Since(began) > c.ConnectWait {
			return nil, fmt.Errorf("connect to nats at %s: %w", c.URL, err)
		}
		if c.Waiting != nil {
			c.Waiting(err)
		}
		if now := time.Now(); now.Sub(reported) >= waitReport {
			// At the default level: a pod the bus refuses (its auth callout down)
			// must say what it waits for.
			log.Info("waiting for the bus", "url", c.URL, "waited", now.Sub(began).Round(time.Second), "error", err)
			reported = now
		} else {
			log.Debug("nats not reachable yet", "url", c.URL, "error", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to nats at %s: %w", c.URL, ctx.Err())
		case <-time.After(retry.Next()):
		}
	}
}

// reconnectDelay is the wait before a connection's attempt-th reconnect pass
// (attempt 1 after the loss): Reconnect's schedule, jittered.
func reconnectDelay(attempt int) time.Duration {
	d := Reconnect.First
	for i := 1; i < attempt && d < Reconnect.Max; i++ {
		d = min(2*d, Reconnect.Max)
	}
	return Reconnect.Apply(d)
}

// Drain drains nc (its subscriptions finish what they hold, its pending
// publishes are flushed) and waits until it is closed: at most the drain timeout
// Connect sets, so a stopping service never leaves its connection behind.
func Drain(nc *nats.Conn) {
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := nc.Drain(); err != nil || nc.IsClosed() {
		nc.Close()
		return
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		nc.Close()
	}
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

// Default retention of the CA's history (the audit log): seven days, at most 1 GiB
// (the oldest events go first). Only the signer and the rotator publish into it.
const (
	DefaultEventStreamMaxAge   = 7 * 24 * time.Hour
	DefaultEventStreamMaxBytes = int64(1) << 30
)

// Default bounds of the pods' events (events.StreamPodEvents). A pod may publish on
// its own subjects only; these keep what one pod publishes from costing more than
// its share: a pod's flood replaces that pod's older events of the same kind
// (per subject), never the CA's history, which is another stream.
const (
	DefaultPodEventsMaxAge            = 24 * time.Hour
	DefaultPodEventsMaxBytes          = int64(256) << 20
	DefaultPodEventsMaxMsgsPerSubject = 64
	// DefaultPodEventsMaxMsgSize is the largest pod event the stream stores:
	// the largest event (events.MaxEventSize) and its headers.
	DefaultPodEventsMaxMsgSize = events.MaxEventSize + 4096
)

// Retention bounds the event history. Zero values take the defaults; MaxBytes < 0
// removes the size bound of the CA's history.
type Retention struct {
	MaxAge   time.Duration
	MaxBytes int64
	// Pods bounds the pods' events.
	Pods PodEventLimits
}

// PodEventLimits bound the pods' event stream. Zero values take the defaults
// (DefaultPodEvents*); none can be removed.
type PodEventLimits struct {
	MaxAge            time.Duration
	MaxBytes          int64
	MaxMsgsPerSubject int64
	MaxMsgSize        int32
}

// WithDefaults fills the zero (or negative) bounds with the defaults.
func (l PodEventLimits) WithDefaults() PodEventLimits {
	if l.MaxAge <= 0 {
		l.MaxAge = DefaultPodEventsMaxAge
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultPodEventsMaxBytes
	}
	if l.MaxMsgsPerSubject <= 0 {
		l.MaxMsgsPerSubject = DefaultPodEventsMaxMsgsPerSubject
	}
	if l.MaxMsgSize <= 0 {
		l.MaxMsgSize = DefaultPodEventsMaxMsgSize
	}
	return l
}

// EnsureEventStream creates or updates the JetStream streams that keep the events:
// the CA's history (events.StreamEvents over events.CAEventSubjects) and the pods'
// events (events.StreamPodEvents over events.PodEventsWildcard, with the default
// PodEventLimits). replicas is 1 on an embedded server, 3 on a fleet's cluster;
// maxAge bounds the CA's history. Its size bound is the one the stream already has
// (an operator may set it with the nats CLI), else DefaultEventStreamMaxBytes.
func EnsureEventStream(ctx context.Context, js jetstream.JetStream, replicas int, maxAge time.Duration) (jetstream.Stream, error) {
	r := Retention{MaxAge: maxAge}
	if st, err := js.Stream(ctx, events.StreamEvents); err == nil && st.CachedInfo() != nil {
		r.MaxBytes = st.CachedInfo().Config.MaxBytes
	}
	return EnsureEventStreamRetention(ctx, js, replicas, r)
}

// EnsureEventStreamRetention is EnsureEventStream with every bound given. It returns
// the CA's history stream.
//
// A CA history stream made before the split captured meshagent.evt.> whole: it is
// narrowed first (the pods' events it already holds stay until they age out), since
// two streams may not capture one subject.
func EnsureEventStreamRetention(ctx context.Context, js jetstream.JetStream, replicas int, r Retention) (jetstream.Stream, error) {
	if replicas <= 0 {
		replicas = 1
	}
	if r.MaxAge <= 0 {
		r.MaxAge = DefaultEventStreamMaxAge
	}
	switch {
	case r.MaxBytes == 0:
		r.MaxBytes = DefaultEventStreamMaxBytes
	case r.MaxBytes < 0:
		r.MaxBytes = -1
	}
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        events.StreamEvents,
		Description: "meshagent CA history: certificates issued, trust changes, rotations",
		Subjects:    events.CAEventSubjects,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		MaxAge:      r.MaxAge,
		MaxBytes:    r.MaxBytes,
		Discard:     jetstream.DiscardOld,
		// Readers (audit) read by sequence, in batches: direct gets, no consumer.
		AllowDirect: true,
		MaxMsgSize:  events.MaxEventSize + 4096,
		Duplicates:  2 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", events.StreamEvents, err)
	}
	if _, err := EnsurePodEventStream(ctx, js, replicas, r.Pods); err != nil {
		return nil, err
	}
	return st, nil
}

// EnsurePodEventStream creates or updates the pods' event stream with limits l
// (zero values: the defaults). Old events go first; a subject (one pod, one kind)
// keeps at most l.MaxMsgsPerSubject events.
func EnsurePodEventStream(ctx context.Context, js jetstream.JetStream, replicas int, l PodEventLimits) (jetstream.Stream, error) {
	if replicas <= 0 {
		replicas = 1
	}
	l = l.WithDefaults()
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:              events.StreamPodEvents,
		Description:       "meshagent pods' events (up, down, sds, xds, envoy), bounded per pod and kind",
		Subjects:          []string{events.PodEventsWildcard},
		Storage:           jetstream.FileStorage,
		Replicas:          replicas,
		MaxAge:            l.MaxAge,
		MaxBytes:          l.MaxBytes,
		MaxMsgsPerSubject: l.MaxMsgsPerSubject,
		MaxMsgSize:        l.MaxMsgSize,
		Discard:           jetstream.DiscardOld,
		AllowDirect:       true,
		Duplicates:        2 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", events.StreamPodEvents, err)
	}
	return st, nil
}

// Publish sends one event to JetStream and waits for the stream's ack, retrying
// while the stream has no leader (a cluster electing one after a node loss). Each
// attempt waits at most PublishAttempt for its ack: a publish sent to a leader
// that just died is never acknowledged, and the next attempt reaches the new one.
// The event id is the dedup id, so a retry never stores an event twice.
func Publish(ctx context.Context, js jetstream.JetStream, msg *nats.Msg) error {
	backoff := 50 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, PublishAttempt)
		_, err := js.PublishMsg(actx, msg, jetstream.WithMsgID(msg.Header.Get(events.HeaderID)))
		cancel()
		if err == nil {
			return nil
		}
		if !retryable(err) {
			return fmt.Errorf("publish %s: %w", msg.Subject, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish %s: %w (last error: %v)", msg.Subject, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// PublishAttempt bounds the wait for one publish's ack (Publish).
const PublishAttempt = 2 * time.Second

func retryable(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting)
}
