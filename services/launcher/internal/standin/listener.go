package standin

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// listener is one of the stand-in's listeners, counting its connections as Envoy's
// downstream_cx_active and downstream_cx_total.
type listener struct {
	name    string
	inbound bool
	ln      net.Listener
	active  atomic.Int64
	total   atomic.Int64
	once    sync.Once
}

func newListener(name string, inbound bool, ln net.Listener) *listener {
	return &listener{name: name, inbound: inbound, ln: ln}
}

// close stops accepting; open connections go on.
func (l *listener) close() { l.once.Do(func() { _ = l.ln.Close() }) }

// track counts an HTTP server's connections (http.Server.ConnState).
func (l *listener) track(_ net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		l.active.Add(1)
		l.total.Add(1)
	case http.StateClosed, http.StateHijacked:
		l.active.Add(-1)
	}
}

// echo serves connections by echoing what they send until the peer closes.
func (l *listener) echo() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.active.Add(1)
		l.total.Add(1)
		go func() {
			defer l.active.Add(-1)
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

// httpServer is Istio's stats listener: GET /stats/prometheus from the admin.
type httpServer struct{ adminAddr string }

func (h *httpServer) serve(l *listener) {
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, ConnState: l.track,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || r.URL.Path != "/stats/prometheus" {
				http.NotFound(w, r)
				return
			}
			resp, err := http.Get("http://" + h.adminAddr + "/stats/prometheus")
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			defer resp.Body.Close()
			w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
			_, _ = io.Copy(w, bufio.NewReader(resp.Body))
		})}
	_ = srv.Serve(l.ln)
}
