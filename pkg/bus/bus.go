// Package bus connects services to the NATS bus. Every service connects through
// Connect, so securing the bus (credentials, TLS) is configuration, not code.
package bus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultURL is where services look for NATS when nothing is configured.
const DefaultURL = nats.DefaultURL

// Config says how to reach the bus.
type Config struct {
	URL       string // comma-separated server URLs
	CredsFile string // NATS .creds file (JWT + nkey seed)
	TLS       TLSConfig
	Name      string // connection name, shown in server monitoring
}

// TLSConfig enables TLS to the bus when CAFile or CertFile is set.
type TLSConfig struct {
	CAFile   string
	CertFile string
	KeyFile  string
}

// Bind registers the bus flags (and their env vars) on fs.
func (c *Config) Bind(fs *flagenv.Set) {
	fs.String(&c.URL, "nats-url", "NATS_URL", DefaultURL, "NATS server URL(s), comma-separated")
	fs.String(&c.CredsFile, "nats-creds", "NATS_CREDS", "", "NATS credentials file")
	fs.String(&c.TLS.CAFile, "nats-tls-ca", "NATS_TLS_CA", "", "CA bundle to verify the NATS server")
	fs.String(&c.TLS.CertFile, "nats-tls-cert", "NATS_TLS_CERT", "", "client certificate for NATS mTLS")
	fs.String(&c.TLS.KeyFile, "nats-tls-key", "NATS_TLS_KEY", "", "client key for NATS mTLS")
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if strings.TrimSpace(c.URL) == "" {
		errs = append(errs, errors.New("-nats-url: required"))
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		errs = append(errs, errors.New("-nats-tls-cert and -nats-tls-key: set both or neither"))
	}
	return errors.Join(errs...)
}

// Connect dials the bus. It retries the initial connection for up to wait and then
// reconnects forever; connection changes are logged on log.
func Connect(ctx context.Context, c Config, log hclog.Logger, wait time.Duration) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(c.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(false),
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
	if c.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.TLS.CAFile != "" {
		opts = append(opts, nats.RootCAs(c.TLS.CAFile))
	}
	if c.TLS.CertFile != "" {
		opts = append(opts, nats.ClientCert(c.TLS.CertFile, c.TLS.KeyFile))
	}
	deadline := time.Now().Add(wait)
	backoff := 50 * time.Millisecond
	for {
		nc, err := nats.Connect(c.URL, opts...)
		if err == nil {
			log.Debug("nats connected", "url", nc.ConnectedUrlRedacted())
			return nc, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("connect to nats at %s: %w", c.URL, err)
		}
		log.Debug("nats not reachable yet", "url", c.URL, "error", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to nats at %s: %w", c.URL, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// EnsureEventStream creates or updates the JetStream stream that keeps the event
// history (events.StreamEvents over events.EventsWildcard). replicas is 1 on an
// embedded server, 3 on a fleet's cluster; maxAge bounds the history.
func EnsureEventStream(ctx context.Context, js jetstream.JetStream, replicas int, maxAge time.Duration) (jetstream.Stream, error) {
	if replicas <= 0 {
		replicas = 1
	}
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        events.StreamEvents,
		Description: "meshagent event history",
		Subjects:    []string{events.EventsWildcard},
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		MaxAge:      maxAge,
		MaxMsgSize:  events.MaxEventSize + 4096,
		Duplicates:  2 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", events.StreamEvents, err)
	}
	return st, nil
}

// Publish sends one event to JetStream and waits for the stream's ack, retrying
// while the stream has no leader (a cluster electing one after a node loss). The
// event id is the dedup id, so a retry never stores an event twice.
func Publish(ctx context.Context, js jetstream.JetStream, msg *nats.Msg) error {
	backoff := 50 * time.Millisecond
	for {
		_, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(msg.Header.Get(events.HeaderID)))
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

func retryable(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting)
}
