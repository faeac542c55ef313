package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/nats-io/nats.go"
)

// busFlags say which bus a command talks to, and as whom: by default the local
// stack's (stack.json) as its operator (the admin credential); with flags, any bus.
type busFlags struct {
	url, nkey, creds string
	tlsCA            string
}

func (b *busFlags) bind(fs *flagenv.Set) {
	fs.String(&b.url, "nats-url", "NATS_URL", "", "NATS URL (default: the local stack's, from stack.json)")
	fs.String(&b.nkey, "nats-nkey", "NATS_NKEY", "", "nkey seed file to connect with (default: the local stack's admin credential)")
	fs.String(&b.creds, "nats-creds", "NATS_CREDS", "", "NATS .creds file to connect with (instead of -nats-nkey)")
	fs.String(&b.tlsCA, "nats-tls-ca", "NATS_TLS_CA", "", "CA bundle to verify the NATS server (a tls:// URL)")
}

// connect dials the bus as meshctl: with the admin role's inbox, so that replies to
// its requests reach it on a secured bus. st may be nil when the flags say it all.
func (b *busFlags) connect(ctx context.Context, st *stackfile.Stack, name string) (*nats.Conn, error) {
	if b.nkey != "" && b.creds != "" {
		return nil, errors.New("-nats-nkey, -nats-creds: set one, not both")
	}
	cfg := bus.Config{URL: b.url, NKeyFile: b.nkey, CredsFile: b.creds, Name: name, InboxPrefix: policy.Inbox(policy.Admin, ""),
		TLS: bus.TLSConfig{CAFile: b.tlsCA}, ConnectWait: 2 * time.Second}
	if st != nil {
		if cfg.URL == "" {
			cfg.URL = st.NATSURL
		}
		if cfg.NKeyFile == "" && cfg.CredsFile == "" {
			cfg.NKeyFile = st.NATSAdminNKey
		}
	}
	if cfg.URL == "" {
		return nil, errors.New("-nats-url: required without a local stack")
	}
	nc, err := bus.Connect(ctx, cfg, hclog.NewNullLogger())
	if err != nil {
		return nil, fmt.Errorf("%w (a secured bus needs -nats-nkey or -nats-creds, and -nats-tls-ca for a tls:// URL)", err)
	}
	return nc, nil
}

// stackFor reads the local stack unless the flags name a bus and a credential.
func (b *busFlags) stackFor(dir string) (*stackfile.Stack, error) {
	if b.url != "" && (b.nkey != "" || b.creds != "") {
		return nil, nil
	}
	return stackfile.Read(dir)
}
