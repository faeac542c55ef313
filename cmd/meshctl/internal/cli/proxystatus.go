package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"path"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/events"
)

// xdsTypes is the xDS sync state of the pods, folded from their events in order
// (xds.connected, xds.acked, xds.nack, xds.disconnected, pod.down): what istioctl
// proxy-status shows, from the bus instead of from istiod.
type xdsTypes struct {
	streams map[string]*adsStream // by pod + " " + stream id
}

// adsStream is one Envoy ADS stream through a pod's xds-relay.
type adsStream struct {
	Pod, ID, Mode, Upstream string
	Connected               time.Time
	Closed                  time.Time // zero while open
	Reason                  string
	Types                   map[string]*typeSync // by type URL
}

// typeSync is the last version of one type Envoy ACKed, and its last NACK.
type typeSync struct {
	Acked        string
	AckedAt      time.Time
	Nacked       string // the nonce's version rejected ("" when none since the last ACK)
	NackedAt     time.Time
	NackedDetail string
}

func newXDSTypes() *xdsTypes { return &xdsTypes{streams: map[string]*adsStream{}} }

// add folds one event in.
func (x *xdsTypes) add(e auditlog.Entry) {
	at := e.Meta.Time
	stream := func(pod events.PodRef, id string) *adsStream {
		s := x.streams[pod.String()+" "+id]
		if s == nil {
			s = &adsStream{Pod: pod.String(), ID: id, Types: map[string]*typeSync{}}
			x.streams[pod.String()+" "+id] = s
		}
		return s
	}
	typ := func(s *adsStream, url string) *typeSync {
		t := s.Types[url]
		if t == nil {
			t = &typeSync{}
			s.Types[url] = t
		}
		return t
	}
	switch p := e.Payload.(type) {
	case events.XDSConnected:
		// A relay that restarted counts its streams from 1 again: a new stream.
		s := &adsStream{Pod: p.Pod.String(), ID: p.Stream, Mode: p.Mode, Upstream: p.Upstream, Connected: at, Types: map[string]*typeSync{}}
		x.streams[p.Pod.String()+" "+p.Stream] = s
	case events.XDSAcked:
		t := typ(stream(p.Pod, p.Stream), p.TypeURL)
		t.Acked, t.AckedAt, t.Nacked = cmp.Or(p.Version, "(delta)"), at, ""
	case events.XDSNack:
		t := typ(stream(p.Pod, p.Stream), p.TypeURL)
		t.Nacked, t.NackedAt, t.NackedDetail = cmp.Or(p.Nonce, "?"), at, p.ErrorDetail
	case events.XDSDisconnected:
		s := stream(p.Pod, p.Stream)
		s.Closed, s.Reason = at, p.Reason
	case events.PodDown:
		for _, s := range x.streams {
			if s.Pod == p.Pod.String() && s.Closed.IsZero() {
				s.Closed, s.Reason = at, "pod down: "+p.Reason
			}
		}
	}
}

// list is the streams sorted by pod, then stream; closed ones only with all.
func (x *xdsTypes) list(all bool, pod string) []*adsStream {
	var out []*adsStream
	for _, s := range x.streams {
		if (all || s.Closed.IsZero()) && (pod == "" || s.Pod == pod) {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Pod != out[j].Pod {
			return out[i].Pod < out[j].Pod
		}
		return out[i].Connected.Before(out[j].Connected)
	})
	return out
}

// shortType names an xDS type as operators do (CDS, LDS, ...).
func shortType(url string) string {
	switch path.Base(strings.TrimPrefix(url, "type.googleapis.com/")) {
	case "envoy.config.cluster.v3.Cluster":
		return "CDS"
	case "envoy.config.listener.v3.Listener":
		return "LDS"
	case "envoy.config.endpoint.v3.ClusterLoadAssignment":
		return "EDS"
	case "envoy.config.route.v3.RouteConfiguration":
		return "RDS"
	case "envoy.extensions.transport_sockets.tls.v3.Secret":
		return "SDS"
	}
	parts := strings.Split(url, ".")
	return parts[len(parts)-1]
}

// cell is one type's state: "ACK v3 (2m ago)", "NACK (nonce 4): why", "-".
func (t *typeSync) cell(now time.Time) string {
	if t == nil {
		return "-"
	}
	if t.Nacked != "" {
		return fmt.Sprintf("NACK %s %s ago (last ACK %s)", t.Nacked, humanDuration(now.Sub(t.NackedAt)), cmp.Or(t.Acked, "none"))
	}
	return fmt.Sprintf("ACK %s %s ago", t.Acked, humanDuration(now.Sub(t.AckedAt)))
}

// printStreams is the proxy-status table.
func printStreams(w io.Writer, streams []*adsStream, now time.Time) {
	cols := []string{}
	for _, s := range streams {
		for u := range s.Types {
			if !slices.Contains(cols, u) {
				cols = append(cols, u)
			}
		}
	}
	order := map[string]int{"CDS": 0, "LDS": 1, "EDS": 2, "RDS": 3, "SDS": 4}
	sort.Slice(cols, func(i, j int) bool {
		a, b := shortType(cols[i]), shortType(cols[j])
		oa, ok := order[a]
		if !ok {
			oa = 9
		}
		ob, ok := order[b]
		if !ok {
			ob = 9
		}
		if oa != ob {
			return oa < ob
		}
		return a < b
	})
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "POD\tSTREAM\tUPSTREAM\tCONNECTED"
	for _, c := range cols {
		head += "\t" + shortType(c)
	}
	fmt.Fprintln(tw, head)
	for _, s := range streams {
		state := humanDuration(now.Sub(s.Connected)) + " ago"
		if s.Connected.IsZero() {
			state = "?"
		}
		if !s.Closed.IsZero() {
			state = "CLOSED " + humanDuration(now.Sub(s.Closed)) + " ago: " + short(s.Reason, 40)
		}
		line := fmt.Sprintf("%s\t%s %s\t%s\t%s", s.Pod, s.ID, cmp.Or(s.Mode, "?"), cmp.Or(s.Upstream, "-"), state)
		for _, c := range cols {
			line += "\t" + s.Types[c].cell(now)
		}
		fmt.Fprintln(tw, line)
	}
	_ = tw.Flush()
}

// readXDS folds the pods' xDS events (and pod.down) from the history; pod limits
// them to one pod.
func readXDS(ctx context.Context, l *auditlog.Log, pod string) (*xdsTypes, error) {
	x := newXDSTypes()
	f := auditlog.Filter{Pod: pod, Types: []string{events.TypeXDSConnected, events.TypeXDSDisconnected, events.TypeXDSAcked,
		events.TypeXDSNack, events.TypePodDown}}
	err := l.Read(ctx, f, false, nil, func(e auditlog.Entry) error {
		if e.Err == nil {
			x.add(e)
		}
		return nil
	})
	return x, err
}

// runProxyStatus prints each pod's ADS streams: upstream, and per type the last
// version Envoy ACKed or NACKed (istioctl proxy-status), from the pods' events.
func runProxyStatus(ctx context.Context, env Env, args []string) error {
	var dir string
	var all bool
	var bf busFlags
	fs := readerFlags("proxy-status", env, &dir, &bf)
	fs.Bool(&all, "all", "", false, "also list closed streams")
	words, err := parseWords(fs, args)
	if err != nil {
		return err
	}
	pod := ""
	switch len(words) {
	case 0:
	case 1:
		p, err := parsePod(words[0])
		if err != nil {
			return fmt.Errorf("pod: %w", err)
		}
		pod = p.String()
	default:
		return fmt.Errorf("%w: meshctl proxy-status [-all] [NAMESPACE/NAME]", errUsage)
	}
	nc, l, err := bf.openAudit(ctx, dir, "meshctl proxy-status")
	if err != nil {
		return err
	}
	defer nc.Close()
	x, err := readXDS(ctx, l, pod)
	if err != nil {
		return err
	}
	streams := x.list(all, pod)
	if len(streams) == 0 {
		fmt.Fprintln(env.Stdout, "no open ADS streams in the pods' events (is a pod's Envoy connected to its xds-relay?)")
		return nil
	}
	printStreams(env.Stdout, streams, time.Now())
	return nil
}
