// Package gatewaycreds serves a gateway's TLS credentials over SDS by name, apart
// from the workload identity. `kubernetes://NAME` (or `kubernetes://NAMESPACE/NAME`)
// names a secret mounted as a directory under one root, as Kubernetes mounts a TLS
// secret (tls.crt, tls.key, ca.crt; or Istio's generic cert, key, cacert), and is
// served as that certificate and key; `kubernetes://NAME-cacert` is the CA
// certificate of NAME (unless a secret of that very name is mounted), served as a
// validation context, as Istio's gateways name it.
//
// A name is resolved on first ask and its files are then watched (pkg filecerts:
// Kubernetes' ..data symlink swaps included); files that stop loading keep the last
// good value. These resources live in their own store behind their own socket, so a
// gateway credential can never shadow, or be shadowed by, `default` or `ROOTCA`,
// and the workload's private key is never reachable through this server.
package gatewaycreds

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/services/sds-edge/internal/filecerts"
	"github.com/meshagent/meshagent/services/sds-edge/internal/secrets"
)

const (
	// Prefix starts every gateway credential name.
	Prefix = "kubernetes://"
	// CACertSuffix names the CA certificate of a secret: kubernetes://NAME-cacert.
	CACertSuffix = "-cacert"
)

// Names are the resource names the gateway credential server accepts.
var Names = secrets.Names{
	Prefixes: []string{Prefix},
	Want:     Prefix + "<secret>, " + Prefix + "<namespace>/<secret> or " + Prefix + "<secret>" + CACertSuffix,
}

// Reasons a name is refused, the label of the refusal metric.
const (
	ReasonBadName  = "bad_name"
	ReasonAbsent   = "absent"
	ReasonBadFiles = "bad_files"
)

// File names in a secret directory, in order of preference.
var (
	certKeyFiles = [][2]string{{"tls.crt", "tls.key"}, {"cert", "key"}}
	caFiles      = []string{"ca.crt", "cacert"}
)

// Resolver maps gateway credential names to secret directories under a root and
// loads them into a filecerts loader (whose store is the gateway's own).
type Resolver struct {
	root    string
	files   *filecerts.Files
	refused *prometheus.CounterVec
	log     hclog.Logger
}

var _ secrets.Resolver = (*Resolver)(nil)

// New returns a resolver of names under root, loading into files.
func New(root string, files *filecerts.Files, reg prometheus.Registerer, log hclog.Logger) (*Resolver, error) {
	r := &Resolver{root: root, files: files, log: log, refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshagent_sds_edge_gateway_credential_refusals_total",
		Help: "Gateway credential names refused, by reason (bad_name, absent, bad_files).",
	}, []string{"reason"})}
	if err := reg.Register(r.refused); err != nil {
		return nil, fmt.Errorf("register gateway credential metrics: %w", err)
	}
	return r, nil
}

// refusal is an error with the reason it is counted under.
type refusal struct {
	reason string
	err    error
}

func (e *refusal) Error() string { return e.err.Error() }

// Resolve loads and watches the secret a name refers to, or says why it cannot.
func (r *Resolver) Resolve(name string) error {
	err := r.resolve(name)
	if err != nil {
		reason := ReasonBadFiles
		var rf *refusal
		if errors.As(err, &rf) {
			reason = rf.reason
		}
		r.refused.WithLabelValues(reason).Inc()
		r.log.Warn("gateway credential refused", "name", name, "reason", reason, "error", err)
	}
	return err
}

func (r *Resolver) resolve(name string) error {
	ref, ok := strings.CutPrefix(name, Prefix)
	if !ok {
		return &refusal{ReasonBadName, fmt.Errorf("want %s", Names.Want)}
	}
	dir, err := r.dir(ref)
	if err != nil {
		return err
	}
	if base, isCA := strings.CutSuffix(ref, CACertSuffix); isCA && !isDir(dir) {
		if dir, err = r.dir(base); err != nil {
			return err
		}
		if !isDir(dir) {
			return &refusal{ReasonAbsent, fmt.Errorf("no secret directory %s", dir)}
		}
		p, ok := firstFile(dir, caFiles)
		if !ok {
			return &refusal{ReasonBadFiles, fmt.Errorf("%s holds no %s", dir, strings.Join(caFiles, " or "))}
		}
		if err := r.files.AddRoots(name, p); err != nil {
			return &refusal{ReasonBadFiles, err}
		}
		return nil
	}
	if !isDir(dir) {
		return &refusal{ReasonAbsent, fmt.Errorf("no secret directory %s", dir)}
	}
	for _, ck := range certKeyFiles {
		cert, key := filepath.Join(dir, ck[0]), filepath.Join(dir, ck[1])
		if isFile(cert) {
			if err := r.files.AddCert(name, cert, key); err != nil {
				return &refusal{ReasonBadFiles, err}
			}
			return nil
		}
	}
	return &refusal{ReasonBadFiles, fmt.Errorf("%s holds no tls.crt/tls.key or cert/key", dir)}
}

// secretName is a Kubernetes object name (a DNS-1123 subdomain): it can never
// climb out of the root.
var secretName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// dir is the directory of ref, NAME or NAMESPACE/NAME.
func (r *Resolver) dir(ref string) (string, error) {
	parts := strings.Split(ref, "/")
	if len(parts) > 2 {
		return "", &refusal{ReasonBadName, fmt.Errorf("%q: want <secret> or <namespace>/<secret>", ref)}
	}
	for _, p := range parts {
		if len(p) > 253 || !secretName.MatchString(p) {
			return "", &refusal{ReasonBadName, fmt.Errorf("%q is not a Kubernetes object name", p)}
		}
	}
	return filepath.Join(append([]string{r.root}, parts...)...), nil
}

func firstFile(dir string, names []string) (string, bool) {
	for _, n := range names {
		if p := filepath.Join(dir, n); isFile(p) {
			return p, true
		}
	}
	return "", false
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// isFile follows symlinks, as a mounted secret's files are links into ..data.
func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}
