package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/pkg/auditlog"
	"github.com/meshagent/meshagent/pkg/events"
)

// eventsFlags are meshctl events' flags.
type eventsFlags struct {
	follow bool
	since  string
	pod    string
	types  []string
	output string
}

func runEvents(ctx context.Context, env Env, args []string) error {
	var dir string
	var bf busFlags
	var f eventsFlags
	fs := readerFlags("events", env, &dir, &bf)
	fs.Bool(&f.follow, "follow", "", false, "after the history, print new events as they happen until Ctrl-C")
	fs.String(&f.since, "since", "", "", "replay from this long ago (10m, 1h, 7d) or this time (RFC 3339); default: the whole history kept")
	fs.String(&f.pod, "pod", "", "", "only the events of this pod, <namespace>/<name> or a name in the default namespace")
	fs.List(&f.types, "type", "", nil, "only events of these types, comma-separated (cert.issued,rotation.renew_due,...)")
	fs.String(&f.output, "o", "", "text", "output: text or json (one JSON object per line)")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	filter, err := f.filter(time.Now())
	if err != nil {
		return err
	}
	nc, l, err := bf.openAudit(ctx, dir, "meshctl events")
	if err != nil {
		return err
	}
	defer nc.Close()
	started := func(s auditlog.Start) {
		// Where the replay starts, on stderr: stdout stays the events alone.
		from := "the start of the history"
		if !filter.Since.IsZero() {
			from = filter.Since.Local().Format(time.RFC3339)
		}
		fmt.Fprintf(env.Stderr, "meshctl: reading %s from %s (sequence %d; %d event(s) kept, oldest %s; retention %s)",
			events.StreamEvents, from, s.Seq, s.Bounds.Messages, oldest(s.Oldest), retention(s.Bounds))
		if p := s.Pods; p != nil {
			fmt.Fprintf(env.Stderr, ", with %s (%d pod event(s) kept, oldest %s; at most %d per pod and kind)",
				events.StreamPodEvents, p.Bounds.Messages, oldest(p.Oldest), p.Bounds.MaxPerSubject)
		}
		if f.follow {
			fmt.Fprintf(env.Stderr, ", then following new events (Ctrl-C stops)\n")
		} else {
			fmt.Fprintf(env.Stderr, " up to sequence %d\n", s.Last)
		}
	}
	n := 0
	err = l.Read(ctx, filter, f.follow, started, func(e auditlog.Entry) error {
		n++
		if f.output == "json" {
			b, err := e.JSON()
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(env.Stdout, "%s\n", b)
			return err
		}
		_, err := fmt.Fprintln(env.Stdout, e.Line(time.Now()))
		return err
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if !f.follow && n == 0 {
		fmt.Fprintln(env.Stderr, "meshctl: no events match")
	}
	return nil
}

// filter checks the flags and turns them into a filter; bad values name their flag.
func (f eventsFlags) filter(now time.Time) (auditlog.Filter, error) {
	var errs []error
	out := auditlog.Filter{Types: f.types}
	if f.since != "" {
		t, err := parseSince(f.since, now)
		if err != nil {
			errs = append(errs, fmt.Errorf("-since: %w", err))
		}
		out.Since = t
	}
	if f.pod != "" {
		p, err := parsePod(f.pod)
		if err != nil {
			errs = append(errs, fmt.Errorf("-pod: %w", err))
		}
		out.Pod = p.String()
	}
	known := map[string]bool{}
	for _, t := range events.KnownTypes() {
		known[t], known[auditlog.ShortType(t)] = true, true
	}
	for _, t := range f.types {
		if !known[t] {
			errs = append(errs, fmt.Errorf("-type: unknown event type %q", t))
		}
	}
	if f.output != "text" && f.output != "json" {
		errs = append(errs, fmt.Errorf("-o: %q, want text or json", f.output))
	}
	return out, errors.Join(errs...)
}

// parseSince reads "10m", "1h30m", "7d" (days, which time.ParseDuration lacks) or an
// RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := parseAge(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q: want a duration (10m, 1h, 7d) or an RFC 3339 time", s)
	}
	if d <= 0 {
		return time.Time{}, fmt.Errorf("%q: must be positive", s)
	}
	return now.Add(-d), nil
}

// parseAge is time.ParseDuration plus whole days ("7d", "1d12h").
func parseAge(s string) (time.Duration, error) {
	var days time.Duration
	if i := strings.Index(s, "d"); i > 0 {
		var n int
		if _, err := fmt.Sscanf(s[:i], "%d", &n); err != nil || fmt.Sprint(n) != s[:i] {
			return 0, fmt.Errorf("bad days in %q", s)
		}
		days, s = time.Duration(n)*24*time.Hour, s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	return days + d, err
}

func oldest(t time.Time) string {
	if t.IsZero() || t.Unix() <= 0 {
		return "-"
	}
	return t.Local().Format(time.RFC3339)
}

func retention(b auditlog.Bounds) string {
	age, size := "unlimited age", "unlimited size"
	if b.MaxAge > 0 {
		age = humanDuration(b.MaxAge)
	}
	if b.MaxBytes > 0 {
		size = fmt.Sprintf("%d MiB", b.MaxBytes>>20)
	}
	return age + " / " + size
}
