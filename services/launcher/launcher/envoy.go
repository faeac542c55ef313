package launcher

import (
	"net"
	"strconv"

	"github.com/meshagent/meshagent/services/launcher/internal/bootstrap"
	"github.com/meshagent/meshagent/services/launcher/internal/config"
	"github.com/meshagent/meshagent/services/launcher/internal/envoy"
	"github.com/meshagent/meshagent/services/launcher/internal/supervise"
)

// node is the pod as Istio describes it to Envoy and the control plane.
func (l *Launcher) node() bootstrap.Node {
	c := l.cfg
	return bootstrap.Node{Type: c.Pod.Type, IPs: c.Pod.IPs, Pod: c.Pod.ID, Namespace: c.Pod.Namespace,
		DNSDomain: c.Pod.DNSDomain, ServiceAccount: c.Pod.ServiceAccount, ClusterID: c.Pod.ClusterID,
		MeshID: c.Pod.MeshID, Labels: c.Pod.Labels, RouterMode: c.Pod.RouterMode, Meta: c.Pod.Meta,
		ProxyConfig: c.Pod.ProxyConfig}
}

// NodeID is the Envoy node id the launcher gives this pod (Istio's
// type~ip~pod.namespace~domain), for a control plane that keys on it.
func (l *Launcher) NodeID() string { return l.node().ID() }

func (l *Launcher) bootstrapParams() bootstrap.Params {
	n := l.node()
	p := bootstrap.Params{NodeID: n.ID(), Cluster: n.ServiceCluster(), Metadata: n.Metadata(),
		SDSSocket: l.cfg.SDSSocket, XDSSocket: l.cfg.XDSSocket, AdminAddr: l.cfg.Envoy.AdminAddr,
		StatsAddr: l.cfg.Envoy.StatsAddr}
	if l.cfg.Pod.Type == config.Router {
		p.CredentialSocket = l.cfg.CredentialSocket
	}
	return p
}

// writeBootstrap writes Envoy's bootstrap: the user's own (CUSTOM_BOOTSTRAP), a
// rendered template (ISTIO_BOOTSTRAP), or the one built from the config.
func (l *Launcher) writeBootstrap() error {
	var (
		b   bootstrap.Bootstrap
		err error
		src = "generated"
	)
	switch p := l.bootstrapParams(); {
	case l.cfg.Envoy.CustomBootstrap != "":
		b, err = bootstrap.Load(l.cfg.Envoy.CustomBootstrap)
		src = l.cfg.Envoy.CustomBootstrap
	case l.cfg.Envoy.Template != "":
		b, err = bootstrap.Render(l.cfg.Envoy.Template, p)
		src = "template " + l.cfg.Envoy.Template
	default:
		b, err = bootstrap.Build(p)
	}
	if err != nil {
		return err
	}
	if err := bootstrap.Write(l.cfg.Envoy.BootstrapPath, b); err != nil {
		return err
	}
	l.log.Info("bootstrap written", "path", l.cfg.Envoy.BootstrapPath, "from", src, "node", b.NodeID())
	return nil
}

func (l *Launcher) supervisorConfig(admin envoy.Admin) (supervise.Config, error) {
	c := l.cfg
	ip := net.ParseIP(c.Pod.IPs[0])
	args := envoy.Args(envoy.Options{ConfigPath: c.Envoy.BootstrapPath, DrainDuration: c.Envoy.DrainDuration,
		ParentShutdown: c.Envoy.ParentShutdown, IPv6: ip != nil && ip.To4() == nil, LogLevel: c.Envoy.LogLevel,
		ComponentLevel: c.Envoy.ComponentLevel, LogJSON: c.Log.JSON, Concurrency: c.Envoy.Concurrency,
		Extra: c.Envoy.ExtraArgs})
	var exclude []string
	if c.Envoy.StatsAddr != "" {
		host, port, _ := net.SplitHostPort(c.Envoy.StatsAddr)
		if host == "" {
			host = "0.0.0.0"
		}
		p, _ := strconv.ParseUint(port, 10, 16)
		exclude = append(exclude, bootstrap.ListenerName(host, uint32(p)))
	}
	return supervise.Config{
		Pod:         c.PodRef(),
		Spec:        envoy.Spec{Binary: l.binary, Args: args, UID: c.Envoy.UID, GID: c.Envoy.GID},
		Admin:       admin,
		InboundOnly: c.Pod.Type == config.Sidecar,
		Exclude:     exclude,
		Drain: supervise.Drain{Duration: c.Drain.Duration, ExitOnZero: c.Drain.ExitOnZero, MinDuration: c.Drain.MinDuration,
			PollInterval: c.Drain.PollInterval, Deadline: c.Drain.Deadline},
	}, nil
}
