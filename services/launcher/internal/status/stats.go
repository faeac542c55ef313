package status

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/prometheus/common/expfmt"
)

// stats merges Envoy's stats, the pod services' metrics, the launcher's own and
// the application's (last, as Istio merges them) into one Prometheus text page. Each source is streamed line by line and cut at
// MaxScrape bytes (never mid-line), so a huge or endless source costs bounded
// memory. A family already written by an earlier source is left out of later
// ones (every Go service has go_goroutines): the page stays valid.
func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	m := merger{w: w, seen: map[string]bool{}, max: s.cfg.MaxScrape}
	if u := s.cfg.EnvoyStats(); u != "" {
		s.scrape(r.Context(), &m, "envoy", u)
	}
	for _, u := range s.cfg.Sources {
		s.scrape(r.Context(), &m, u, u)
	}
	if s.cfg.Gatherer != nil {
		var buf bytes.Buffer
		if mfs, err := s.cfg.Gatherer.Gather(); err == nil {
			enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
			for _, mf := range mfs {
				_ = enc.Encode(mf)
			}
		}
		m.copy("launcher", &buf)
	}
	if s.cfg.AppMetrics != "" {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.AppTimeout)
		defer cancel()
		s.scrape(ctx, &m, "app", s.cfg.AppMetrics)
	}
}

func (s *Server) scrape(ctx context.Context, m *merger, name, url string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		m.comment(name, err.Error())
		return
	}
	// The text format only: the page is merged line by line.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.client.Do(req)
	if err != nil {
		what := "unreachable"
		if ctx.Err() != nil {
			what = "timed out"
		}
		m.comment(name, what)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		m.comment(name, fmt.Sprintf("status %d", resp.StatusCode))
		return
	}
	m.copy(name, resp.Body)
}

// merger writes sources one after the other, dropping repeated families.
type merger struct {
	w    io.Writer
	seen map[string]bool // families written by earlier sources
	max  int
}

func (m *merger) comment(source, what string) {
	fmt.Fprintf(m.w, "# source %s: %s\n", source, what)
}

func (m *merger) copy(source string, r io.Reader) {
	mine := map[string]bool{}
	skip := ""
	n := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if fam, ok := familyOf(line); ok {
			skip = ""
			if m.seen[fam] && !mine[fam] {
				skip = fam
				continue
			}
			mine[fam] = true
		} else if skip != "" && strings.HasPrefix(line, skip) {
			continue
		}
		if n+len(line)+1 > m.max {
			m.comment(source, fmt.Sprintf("cut at %d bytes", m.max))
			break
		}
		n += len(line) + 1
		_, _ = io.WriteString(m.w, line+"\n")
	}
	if err := sc.Err(); err != nil {
		m.comment(source, "read: "+err.Error())
	}
	for f := range mine {
		m.seen[f] = true
	}
}

// familyOf returns the metric family a # HELP or # TYPE line names.
func familyOf(line string) (string, bool) {
	for _, p := range []string{"# HELP ", "# TYPE "} {
		if rest, ok := strings.CutPrefix(line, p); ok {
			name, _, _ := strings.Cut(rest, " ")
			return name, true
		}
	}
	return "", false
}
