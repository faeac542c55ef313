package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/inventory"
	"github.com/meshagent/meshagent/pkg/inventory/fleetindex"
	"github.com/nats-io/nats.go"
)

// fleetFlags say where the fleet's pages come from: the operator service's
// inventory API (-operator; by default the local stack's), which answers one page
// or the fleet's counts at the cost of a page, or else the bucket read whole from
// the bus into the same index in meshctl.
type fleetFlags struct {
	operator string
	timeout  time.Duration
}

func (f *fleetFlags) bind(fs *flagenv.Set) {
	fs.String(&f.operator, "operator", "MESHAGENT_OPERATOR", "", "HTTP address of the operator service (its inventory API): pages and counts from its index (default: the local stack's; none: the inventory is read whole from the bus)")
	fs.Duration(&f.timeout, "operator-timeout", "", 30*time.Second, "how long to wait for the operator's answer")
}

// fleetSource answers inventory pages.
type fleetSource interface {
	Page(ctx context.Context, v url.Values) (inventory.Page, error)
	String() string
}

// source picks the operator's API when an address is known (flag, else stack),
// else an index built from the bucket on nc.
func (f *fleetFlags) source(st *stackfile.Stack, nc *nats.Conn) fleetSource {
	addr := f.operator
	if addr == "" && st != nil {
		addr = st.Dashboard
	}
	if addr == "" {
		return &bucketSource{nc: nc}
	}
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	return &operatorAPI{base: strings.TrimSuffix(addr, "/"), timeout: f.timeout}
}

// follower is source for a reader that looks again and again (rotate root
// -wait): the operator's API, else the bucket read whole at every look.
func (f *fleetFlags) follower(st *stackfile.Stack, nc *nats.Conn) fleetSource {
	s := f.source(st, nc)
	if b, ok := s.(*bucketSource); ok {
		b.fresh = true
	}
	return s
}

// operatorAPI is the operator service's /api/inventory.
type operatorAPI struct {
	base    string
	timeout time.Duration
}

func (a *operatorAPI) String() string { return "operator " + a.base }

// Page asks for one page. A failure says what happened and after how long: an
// operator that accepted the connection and did not answer in time is slow, not
// unreachable.
func (a *operatorAPI) Page(ctx context.Context, v url.Values) (inventory.Page, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var connected atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected.Store(true) }})
	start := time.Now()
	took := func() string { return time.Since(start).Round(time.Millisecond).String() }
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/api/inventory?"+v.Encode(), nil)
	if err != nil {
		return inventory.Page{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	var ne net.Error
	switch {
	case err != nil && connected.Load() && (errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()):
		return inventory.Page{}, fmt.Errorf("operator at %s is slow: connected, no answer after %s (-operator-timeout)", a.base, took())
	case err != nil && errors.Is(err, context.DeadlineExceeded):
		return inventory.Page{}, fmt.Errorf("operator at %s: no connection after %s", a.base, took())
	case err != nil:
		return inventory.Page{}, fmt.Errorf("operator at %s unreachable after %s: %w", a.base, took(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return inventory.Page{}, fmt.Errorf("operator at %s answered %s after %s: %s", a.base, resp.Status, took(), strings.TrimSpace(string(body)))
	}
	var p inventory.Page
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		return inventory.Page{}, fmt.Errorf("operator at %s: reading its answer after %s: %w", a.base, took(), err)
	}
	return p, nil
}

// bucketSource reads the bucket whole from the bus, once, into an index: what a
// reader without the operator's address does (a fleet's worth of reads).
type bucketSource struct {
	nc    *nats.Conn
	ix    *fleetindex.Index
	fresh bool // read the bucket again for every page
}

func (b *bucketSource) String() string {
	return "the inventory bucket (read whole: -operator reads a page)"
}

func (b *bucketSource) Page(ctx context.Context, v url.Values) (inventory.Page, error) {
	q, err := fleetindex.ParseQuery(v)
	if err != nil {
		return inventory.Page{}, err
	}
	if b.ix == nil || b.fresh {
		ix, err := fleetindex.ReadBucket(ctx, b.nc)
		if err != nil {
			return inventory.Page{}, err
		}
		b.ix = ix
	}
	return b.ix.Page(q, time.Now()), nil
}

// loadingLine is what a reader prints about a replica still catching up ("" when
// it has).
func loadingLine(p inventory.Page) string {
	if p.Loading == nil {
		return ""
	}
	return fmt.Sprintf("note: the operator is still loading the inventory (%d record(s) read, %d to go): counts are partial", p.Loading.Loaded, p.Loading.Remaining)
}
