package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/nats-io/nats.go"
)

// busFlags say which bus a command talks to, and as whom: by default the local
// stack's (stack.json) as its operator (the admin credential); with flags, any bus.
type busFlags struct {
	url, nkey, creds string
	tlsCA            string
	role             string // the reading commands' -nats-role
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
	return b.connectAs(ctx, st, name, policy.Admin)
}

// bindRole adds -nats-role, for the commands that only read (events, certs,
// status, inspect): they need no more than the audit role.
func (b *busFlags) bindRole(fs *flagenv.Set) {
	fs.String(&b.role, "nats-role", "NATS_ROLE", "", "bus role of the credential, which sets its reply inbox: audit or admin "+
		"(default: audit with the local stack's credential; with -nats-nkey, the role its file is named after (audit.nk, admin.nk), else admin)")
}

// readerRole is the role a reading command connects as (see bindRole).
func (b *busFlags) readerRole() (policy.Role, error) {
	switch {
	case b.role != "":
		if r := policy.Role(b.role); r == policy.Audit || r == policy.Admin {
			return r, nil
		}
		return "", fmt.Errorf("-nats-role: %q, want audit or admin", b.role)
	case b.nkey == "" && b.creds == "":
		return policy.Audit, nil
	case filepath.Base(b.nkey) == string(policy.Audit)+".nk":
		return policy.Audit, nil
	}
	return policy.Admin, nil
}

// reader dials the bus as a reading command's role (readerRole).
func (b *busFlags) reader(ctx context.Context, st *stackfile.Stack, name string) (*nats.Conn, error) {
	r, err := b.readerRole()
	if err != nil {
		return nil, err
	}
	return b.connectAs(ctx, st, name, r)
}

// connectAs dials the bus with role's inbox and, for a local stack, role's seed
// (stack.json names the admin and audit seeds; the others live beside them).
func (b *busFlags) connectAs(ctx context.Context, st *stackfile.Stack, name string, role policy.Role) (*nats.Conn, error) {
	if b.nkey != "" && b.creds != "" {
		return nil, errors.New("-nats-nkey, -nats-creds: set one, not both")
	}
	cfg := bus.Config{URL: b.url, NKeyFile: b.nkey, CredsFile: b.creds, Name: name, InboxPrefix: policy.Inbox(role, events.PodRef{}),
		TLS: bus.TLSConfig{CAFile: b.tlsCA}, ConnectWait: 2 * time.Second}
	if st != nil {
		if cfg.URL == "" {
			cfg.URL = st.NATSURL
		}
		if cfg.NKeyFile == "" && cfg.CredsFile == "" {
			switch role {
			case policy.Admin:
				cfg.NKeyFile = st.NATSAdminNKey
			case policy.Audit:
				cfg.NKeyFile = st.NATSAuditNKey
			default:
				cfg.NKeyFile = filepath.Join(filepath.Dir(st.NATSAdminNKey), string(role)+".nk")
			}
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

// readerFlags starts a reading command's flags (events, certs, status, check,
// inspect, describe, proxy-status, trust, bug-report): -dir, the bus flags and
// -nats-role.
func readerFlags(name string, env Env, dir *string, bf *busFlags) *flagenv.Set {
	fs := flagenv.New(name, env.Getenv)
	dirFlag(fs, dir)
	bf.bind(fs)
	bf.bindRole(fs)
	return fs
}

// dialReader connects a reading command: the local stack in dir is read unless
// the flags name a bus and a credential (stackFor), then the bus is dialled as
// the reader's role (readerRole).
func (b *busFlags) dialReader(ctx context.Context, dir, name string) (*nats.Conn, error) {
	st, err := b.stackFor(dir)
	if err != nil {
		return nil, err
	}
	return b.reader(ctx, st, name)
}

// openAudit is dialReader, then the audit log on that connection, which the
// caller closes.
func (b *busFlags) openAudit(ctx context.Context, dir, name string) (*nats.Conn, *auditlog.Log, error) {
	nc, err := b.dialReader(ctx, dir, name)
	if err != nil {
		return nil, nil, err
	}
	l, err := auditlog.Open(ctx, nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, l, nil
}
