package signer

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"

	"github.com/meshagent/meshagent/pkg/obs"
)

// servePprof serves Go's profiles on -pprof-addr until ctx is done: CPU
// (/debug/pprof/profile?seconds=N), heap and allocations, goroutines, ... — for
// profiling a signer under load (docs/benchmarks.md). Config checks the address is
// loopback.
func (s *Signer) servePprof(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Listen.Pprof)
	if err != nil {
		return fmt.Errorf("listen pprof %s: %w", s.cfg.Listen.Pprof, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s.log.Info("pprof listening", "addr", ln.Addr().String())
	return obs.Serve(ctx, ln, mux)
}
