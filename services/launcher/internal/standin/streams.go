package standin

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

// Type URLs the stand-in asks for over ADS.
const (
	ClusterType  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	ListenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
)

// streams opens the streams Envoy would — SDS for `default` and `ROOTCA` on
// sds-edge's socket, ADS for clusters and listeners on xds-relay's socket — ACKs
// what it gets, and reports each update, so that a person running meshctl up sees
// identity and configuration arrive the way Envoy would receive them.
type streams struct {
	Clock  clock.Clock
	Pod    string
	NodeID string
	// Node is the bootstrap's node, sent whole on the first ADS request as Envoy
	// sends it (metadata included: a real control plane such as istiod reads the
	// proxy's namespace, cluster and version from it); nil: id and Pod as cluster.
	Node      *corev3.Node
	SDSSocket string
	XDSSocket string
	Report    func(line string)
	// GotSecrets is called with each SDS update's names; GotConfig with each ADS
	// response's type URL.
	GotSecrets func(names []string)
	GotConfig  func(typeURL string)
}

// run keeps both streams open until ctx ends, redialling after failures.
func (e *streams) run(ctx context.Context) {
	if e.SDSSocket != "" {
		go e.loop(ctx, "sds", e.sds)
	}
	if e.XDSSocket != "" {
		go e.loop(ctx, "ads", e.ads)
	}
	<-ctx.Done()
}

// loop reruns f after each failure, reporting a failure only when it differs from
// the previous one, so that an unreachable upstream is one line, not one a second.
func (e *streams) loop(ctx context.Context, what string, f func(context.Context) error) {
	last := ""
	for ctx.Err() == nil {
		err := f(ctx)
		if ctx.Err() != nil {
			return
		}
		if msg := fmt.Sprint(err); msg != last {
			e.Report(fmt.Sprintf("envoy %s: %s stream ended (%v); retrying every second", e.Pod, what, err))
			last = msg
		}
		backoff.Wait(ctx, e.Clock, time.Second)
	}
}

func (e *streams) sds(ctx context.Context) error {
	cc, err := sdsclient.DialUnix(ctx, e.SDSSocket)
	if err != nil {
		return err
	}
	defer cc.Close()
	st, err := sdsclient.Open(ctx, cc, e.NodeID, "default", "ROOTCA")
	if err != nil {
		return err
	}
	defer st.Close()
	for {
		u, err := st.Recv()
		if err != nil {
			return err
		}
		names := make([]string, 0, len(u.Secrets))
		for _, s := range u.Secrets {
			names = append(names, s.Name)
			e.Report(fmt.Sprintf("envoy %s: sds %s version %s: %s", e.Pod, s.Name, u.Version, e.summarize(s)))
		}
		e.GotSecrets(names)
	}
}

// summarize is one line about secret s: a certificate's serial and time left, or
// the roots' fingerprints.
func (e *streams) summarize(s sdsclient.Secret) string {
	if s.IsCertificate() {
		cs, err := pki.ParseCertsPEM(s.CertChain)
		if err != nil {
			return "unparsable chain: " + err.Error()
		}
		return fmt.Sprintf("serial %s, expires in %s", pki.SerialHex(cs[0]), cs[0].NotAfter.Sub(e.Clock.Now()).Round(time.Second))
	}
	cs, err := pki.ParseCertsPEM(s.TrustedCA)
	if err != nil {
		return "unparsable roots: " + err.Error()
	}
	fps := make([]string, len(cs))
	for i, c := range cs {
		fps[i] = pki.Fingerprint(c)[:12]
	}
	return fmt.Sprintf("%d root(s) %s", len(cs), strings.Join(fps, ","))
}

func (e *streams) ads(ctx context.Context) error {
	cc, err := grpc.NewClient("unix://"+e.XDSSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	node := &corev3.Node{Id: e.NodeID, Cluster: e.Pod}
	if e.Node != nil {
		node = e.Node
	}
	for _, t := range []string{ClusterType, ListenerType} {
		if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: t}); err != nil {
			return err
		}
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		names, perr := resourceNames(resp)
		ack := &discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce(), VersionInfo: resp.GetVersionInfo()}
		if perr != nil {
			ack.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: perr.Error()}
			ack.VersionInfo = ""
		}
		if err := stream.Send(ack); err != nil {
			return err
		}
		short := resp.GetTypeUrl()[strings.LastIndex(resp.GetTypeUrl(), ".")+1:]
		e.Report(fmt.Sprintf("envoy %s: ads %s version %s: %s", e.Pod, short, resp.GetVersionInfo(), strings.Join(names, ", ")))
		e.GotConfig(resp.GetTypeUrl())
	}
}

func resourceNames(resp *discoveryv3.DiscoveryResponse) ([]string, error) {
	var names []string
	for _, a := range resp.GetResources() {
		switch resp.GetTypeUrl() {
		case ClusterType:
			var c clusterv3.Cluster
			if err := a.UnmarshalTo(&c); err != nil {
				return nil, err
			}
			names = append(names, c.GetName())
		case ListenerType:
			var l listenerv3.Listener
			if err := a.UnmarshalTo(&l); err != nil {
				return nil, err
			}
			names = append(names, l.GetName())
		}
	}
	sort.Strings(names)
	return names, nil
}
