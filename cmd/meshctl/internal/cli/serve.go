package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/auditlog"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/dashboard"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/obs"
)

// serveFlags are meshctl serve's settings (meshctl up runs the same server in its
// own process).
type serveFlags struct {
	addr      string
	replicas  int
	history   time.Duration
	file      string
	fileMaxMB int
	fileKeep  int
	hosts     []string
}

func (f *serveFlags) bind(fs *flagenv.Set) {
	fs.String(&f.addr, "http-addr", "HTTP_ADDR", "127.0.0.1:9080", "dashboard, API and /metrics listen address")
	fs.List(&f.hosts, "allowed-hosts", "HTTP_ALLOWED_HOSTS", nil, "host names the dashboard answers besides its -http-addr (and localhost when on loopback): a request for any other Host is refused, against DNS rebinding")
	fs.Int(&f.replicas, "bucket-replicas", "INVENTORY_REPLICAS", 1, "replicas of the inventory bucket if it is created (3 on a fleet's cluster)")
	fs.Duration(&f.history, "history", "", 30*time.Minute, "how much history the page's event feed starts with")
	fs.String(&f.file, "audit-file", "AUDIT_FILE", "", "also write every event seen to this JSON-lines file (rotated by size)")
	fs.Int(&f.fileMaxMB, "audit-file-max-mb", "AUDIT_FILE_MAX_MB", 100, "size in MiB at which -audit-file is rotated")
	fs.Int(&f.fileKeep, "audit-file-keep", "AUDIT_FILE_KEEP", 5, "rotated -audit-file files kept")
}

// config checks the flags.
func (f *serveFlags) config() (dashboard.Config, error) {
	cfg := dashboard.Config{Addr: f.addr, Replicas: f.replicas, History: f.history, Hosts: f.hosts}
	if f.replicas < 1 || f.replicas > 5 {
		return cfg, fmt.Errorf("-bucket-replicas: %d, want 1 to 5", f.replicas)
	}
	if f.file != "" {
		s, err := auditlog.NewSink(f.file, int64(f.fileMaxMB)<<20, f.fileKeep)
		if err != nil {
			return cfg, fmt.Errorf("-audit-file: %w", err)
		}
		cfg.Sink = s
	}
	return cfg, nil
}

func runServe(ctx context.Context, env Env, args []string) error {
	var dir string
	var bf busFlags
	var sf serveFlags
	var logc obs.LogConfig
	fs := flagenv.New("serve", env.Getenv)
	dirFlag(fs, &dir)
	bf.bind(fs)
	sf.bind(fs)
	logc.Bind(fs)
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	if err := logc.Validate(); err != nil {
		return err
	}
	cfg, err := sf.config()
	if err != nil {
		return err
	}
	st, err := bf.stackFor(dir)
	if err != nil {
		return err
	}
	// The inventory's own role: its durable, its bucket, the events (policy.Inventory).
	nc, err := bf.connectAs(ctx, st, "meshctl serve", policy.Inventory)
	if err != nil {
		return err
	}
	defer nc.Close()
	log := obs.NewLogger("meshctl-serve", logc, env.Stderr)
	s, err := dashboard.New(cfg, nc, log)
	if err != nil {
		return err
	}
	go func() {
		select {
		case <-s.Bound():
			fmt.Fprintf(env.Stdout, "meshctl serve: dashboard http://%s/  metrics http://%s/metrics\n", s.Addr(), s.Addr())
		case <-ctx.Done():
		}
	}()
	return s.Run(ctx)
}
