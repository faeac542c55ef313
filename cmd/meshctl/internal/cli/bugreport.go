package cli

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/buildinfo"
)

// runBugReport writes a support bundle (istioctl bug-report): a tar.gz of what the
// other commands say — versions, status, check, proxy-status, the inventory, the
// recent events — and, for a local stack, stack.json and the tail of each service's
// log, tokens and private keys redacted. A step that fails is written as such
// (errors.txt) rather than stopping the rest. No credential goes in: stack.json
// names the credentials' files, and the secrets directory is not read.
func runBugReport(ctx context.Context, env Env, args []string) error {
	var dir, out, since string
	var logBytes int
	var bf busFlags
	fs := readerFlags("bug-report", env, &dir, &bf)
	fs.String(&out, "o", "", "", "where to write the bundle (default: meshagent-bug-report-<UTC time>.tar.gz here)")
	fs.String(&since, "since", "", "1h", "how far back the events go")
	fs.Int(&logBytes, "log-bytes", "", 1<<20, "at most this much of the end of each log")
	words, err := parseWords(fs, args)
	if err != nil {
		return err
	}
	if len(words) != 0 || logBytes < 0 {
		return fmt.Errorf("%w: meshctl bug-report [-o FILE] [-since 1h] [-log-bytes N] [bus flags]", errUsage)
	}
	if _, err := parseSince(since, time.Now()); err != nil {
		return fmt.Errorf("-since: %w", err)
	}
	if out == "" {
		out = "meshagent-bug-report-" + time.Now().UTC().Format("20060102T150405Z") + ".tar.gz"
	}
	common := []string{"-dir", dir}
	for flag, v := range map[string]string{"-nats-url": bf.url, "-nats-nkey": bf.nkey, "-nats-creds": bf.creds, "-nats-tls-ca": bf.tlsCA, "-nats-role": bf.role} {
		if v != "" {
			common = append(common, flag, v)
		}
	}
	b := &bundle{}
	b.add("version.txt", []byte(buildinfo.String("meshctl")+"\n"))
	for _, step := range []reportStep{
		{"status.txt", runStatus, nil, true},
		{"check.txt", runCheck, nil, true},
		{"proxy-status.txt", runProxyStatus, []string{"-all"}, false},
		{"certs.txt", runCerts, []string{"-o", "wide", "-bench", "-limit", "1000"}, false},
		{"events.jsonl", runEvents, []string{"-since", since, "-o", "json"}, false},
		{"trust.txt", runTrust, nil, false},
	} {
		b.run(ctx, env, step, append(append([]string{}, common...), step.args...))
	}
	if st, err := bf.stackFor(dir); err == nil && st != nil {
		if data, err := os.ReadFile(filepath.Join(st.Dir, stackfile.FileName)); err == nil {
			b.add("stack.json", data)
		}
		logs, _ := filepath.Glob(filepath.Join(st.Dir, "logs", "*.log"))
		for _, p := range st.Processes {
			if p.Log != "" && !slices.Contains(logs, p.Log) {
				logs = append(logs, p.Log)
			}
		}
		for _, l := range logs {
			data, err := tail(l, int64(logBytes))
			if err != nil {
				b.errorf("log %s: %v", l, err)
				continue
			}
			b.add("logs/"+filepath.Base(l), redact(data))
		}
	}
	if err := b.write(out); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "wrote %s (%d file(s)%s)\n", out, len(b.files), b.note())
	return nil
}

// reportStep is one command whose output goes into the bundle.
type reportStep struct {
	file string
	run  func(context.Context, Env, []string) error
	args []string
	// findings: the command exits non-zero to report what it found (status's
	// "needs attention", check's FAIL lines), which is its output, not a failure.
	findings bool
}

// run runs one step into the bundle. A step failed when it returned an error
// (and wrote nothing, for a command that reports findings so): what it says on
// stderr — notes, warnings, what it left out — goes to notes.txt, and is no
// failure.
func (b *bundle) run(ctx context.Context, env Env, step reportStep, args []string) {
	var o, e bytes.Buffer
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := step.run(sctx, Env{Stdout: &o, Stderr: &e, Getenv: env.Getenv}, args)
	cancel()
	b.add(step.file, o.Bytes())
	switch {
	case err != nil && step.findings && o.Len() > 0:
		b.notef("%s: %v (its findings are in %s)", step.file, err, step.file)
	case err != nil:
		b.errorf("%s: %v\n%s", step.file, err, e.String())
		return
	}
	if e.Len() > 0 {
		b.notef("%s (stderr):\n%s", step.file, e.String())
	}
}

// tail is the last n bytes of a file.
func tail(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > n {
		if _, err := f.Seek(st.Size()-n, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, n))
}

var (
	jwtLike = regexp.MustCompile(`eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+`)
	keyPEM  = regexp.MustCompile(`(?s)-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----`)
	seedish = regexp.MustCompile(`\bS[UOA][A-Z2-7]{50,}\b`) // an nkey seed
)

// redact blanks what must never leave the machine, should a log hold it: bearer
// tokens, private keys, nkey seeds.
func redact(b []byte) []byte {
	b = jwtLike.ReplaceAll(b, []byte("<redacted token>"))
	b = keyPEM.ReplaceAll(b, []byte("<redacted private key>"))
	return seedish.ReplaceAll(b, []byte("<redacted nkey seed>"))
}

// bundle is the files of a bug report, in order.
type bundle struct {
	files []string
	data  map[string][]byte
	errs  bytes.Buffer // the steps that failed (errors.txt)
	notes bytes.Buffer // what the steps said besides their output (notes.txt)
}

func (b *bundle) add(name string, data []byte) {
	if b.data == nil {
		b.data = map[string][]byte{}
	}
	if _, ok := b.data[name]; !ok {
		b.files = append(b.files, name)
	}
	b.data[name] = data
}

func (b *bundle) errorf(format string, a ...any) { fmt.Fprintf(&b.errs, format+"\n", a...) }

func (b *bundle) notef(format string, a ...any) { fmt.Fprintf(&b.notes, format+"\n", a...) }

func (b *bundle) note() string {
	if b.errs.Len() == 0 {
		return ""
	}
	return "; some steps failed: see errors.txt in it"
}

// write writes the bundle as a tar.gz, 0600 (it describes the fleet).
func (b *bundle) write(path string) error {
	if b.errs.Len() > 0 {
		b.add("errors.txt", b.errs.Bytes())
	}
	if b.notes.Len() > 0 {
		b.add("notes.txt", b.notes.Bytes())
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("-o: %w", err)
	}
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	now := time.Now()
	for _, name := range b.files {
		data := b.data[name]
		if err := tw.WriteHeader(&tar.Header{Name: "meshagent-bug-report/" + name, Mode: 0o600, Size: int64(len(data)), ModTime: now}); err != nil {
			_ = f.Close()
			return err
		}
		if _, err := tw.Write(data); err != nil {
			_ = f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		_ = f.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
