// Package proxyless writes the gRPC xDS bootstrap (the GRPC_XDS_BOOTSTRAP file) for
// a pod without Envoy, as Istio's agent does for proxyless gRPC: the xDS server is
// xds-relay's socket, the node is the pod's, and certificates come from sds-edge's
// OUTPUT_CERTS files through grpc-go's `file_watcher` certificate provider, which
// re-reads them, so a rotated certificate is picked up without a restart.
package proxyless

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// File names sds-edge writes under OUTPUT_CERTS, as Istio's agent names them.
const (
	KeyFile   = "key.pem"
	ChainFile = "cert-chain.pem"
	RootFile  = "root-cert.pem"
)

// ProviderName is the certificate provider instance the bootstrap defines; Istio's
// xDS server names it in the security config it sends proxyless clients.
const ProviderName = "default"

// ServerListenerTemplate is how a gRPC xDS server names its listener resource, as
// Istio serves it.
const ServerListenerTemplate = "xds.istio.io/grpc/lds/inbound/%s"

// Params says what goes into the bootstrap.
type Params struct {
	NodeID    string
	Cluster   string
	Metadata  map[string]any
	XDSSocket string
	CertDir   string        // OUTPUT_CERTS
	Refresh   time.Duration // how often file_watcher re-reads the files
}

// Bootstrap is grpc-go's bootstrap format (the subset written here).
type Bootstrap struct {
	XDSServers []Server `json:"xds_servers"`
	Node       struct {
		ID       string         `json:"id"`
		Cluster  string         `json:"cluster,omitempty"`
		Metadata map[string]any `json:"metadata,omitempty"`
		Locality struct{}       `json:"locality"`
	} `json:"node"`
	CertificateProviders               map[string]Provider `json:"certificate_providers"`
	ServerListenerResourceNameTemplate string              `json:"server_listener_resource_name_template"`
}

// Server is one xDS server entry.
type Server struct {
	URI            string              `json:"server_uri"`
	ChannelCreds   []map[string]string `json:"channel_creds"`
	ServerFeatures []string            `json:"server_features"`
}

// Provider is one certificate provider instance.
type Provider struct {
	Plugin string         `json:"plugin_name"`
	Config map[string]any `json:"config"`
}

// Build returns the bootstrap for p.
func Build(p Params) Bootstrap {
	refresh := p.Refresh
	if refresh <= 0 {
		refresh = 15 * time.Minute
	}
	var b Bootstrap
	b.XDSServers = []Server{{
		URI:            "unix://" + p.XDSSocket,
		ChannelCreds:   []map[string]string{{"type": "insecure"}},
		ServerFeatures: []string{"xds_v3"},
	}}
	b.Node.ID, b.Node.Cluster, b.Node.Metadata = p.NodeID, p.Cluster, p.Metadata
	b.CertificateProviders = map[string]Provider{ProviderName: {Plugin: "file_watcher", Config: map[string]any{
		"certificate_file":    filepath.Join(p.CertDir, ChainFile),
		"private_key_file":    filepath.Join(p.CertDir, KeyFile),
		"ca_certificate_file": filepath.Join(p.CertDir, RootFile),
		"refresh_interval":    fmt.Sprintf("%gs", refresh.Seconds()),
	}}}
	b.ServerListenerResourceNameTemplate = ServerListenerTemplate
	return b
}

// Write writes b as JSON to path atomically (temp file + rename), mode 0644: it
// holds paths, no secret.
func Write(path string, b Bootstrap) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return fmt.Errorf("encode grpc bootstrap: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write grpc bootstrap: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write grpc bootstrap: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write grpc bootstrap: %w", err)
	}
	return nil
}

// CertsPresent reports nil when all three files are there and not empty.
func CertsPresent(dir string) error {
	for _, f := range []string{ChainFile, KeyFile, RootFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			return fmt.Errorf("certificate file: %w", err)
		}
		if st.Size() == 0 {
			return fmt.Errorf("certificate file %s is empty", filepath.Join(dir, f))
		}
	}
	return nil
}
