//go:build compose

package compose

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const project = "meshagent-compose-test"

// secretsDir is the host directory the stack's init container writes the operator's
// credentials to (MESHAGENT_SECRETS_DIR), set by TestMain.
var secretsDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "meshagent-compose-secrets-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	secretsDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func compose(t *testing.T, args ...string) string {
	t.Helper()
	bin := strings.Fields(os.Getenv("COMPOSE"))
	if len(bin) == 0 {
		bin = []string{"docker-compose"}
	}
	full := append(bin[1:], append([]string{"-p", project, "-f", "compose.yaml"}, args...)...)
	cmd := exec.Command(bin[0], full...)
	cmd.Env = append(os.Environ(), "MESHAGENT_SECRETS_DIR="+secretsDir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", bin[0], full, err, out)
	}
	return string(out)
}

// connect dials nats-1 from the host over TLS with a credential from the secrets
// directory ("" for none), retrying until limit.
func connect(t *testing.T, seed, inbox string, limit time.Duration, opts ...nats.Option) (*nats.Conn, error) {
	t.Helper()
	opts = append(opts, nats.RootCAs(filepath.Join(secretsDir, "ca.pem")), nats.MaxReconnects(-1))
	if seed != "" {
		o, err := nats.NkeyOptionFromSeed(filepath.Join(secretsDir, seed))
		if err != nil {
			return nil, err
		}
		opts = append(opts, o, nats.CustomInboxPrefix(inbox))
	}
	deadline := time.Now().Add(limit)
	for {
		nc, err := nats.Connect("tls://127.0.0.1:4222", opts...)
		if err == nil || time.Now().After(deadline) {
			return nc, err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// issued waits for the next cert.issued for pod demo-0 and returns it.
func issued(t *testing.T, ch <-chan events.CertIssued, limit time.Duration, what string) events.CertIssued {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(limit):
		t.Fatalf("%s: no cert.issued for demo-0 within %s", what, limit)
	}
	return events.CertIssued{}
}

// renew drops any cert.issued already queued, then forces demo-0 to renew.
func renew(t *testing.T, nc *nats.Conn, ch chan events.CertIssued) {
	t.Helper()
	for len(ch) > 0 {
		<-ch
	}
	subj, _ := events.PodRenewSubject("demo-0")
	msg, err := events.NewMsg(subj, "compose-test", events.RenewDue{Pod: "demo-0", Resource: "default", Reason: events.RenewForced})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
}

// firstIssued reads the event history for demo-0's first cert.issued: when the
// stack first served the pod. The admin may read the stream by sequence (no
// consumers: pkg/bus/policy).
func firstIssued(ctx context.Context, t *testing.T, nc *nats.Conn) (events.CertIssued, time.Time) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	next := uint64(1)
	for ctx.Err() == nil {
		// Short requests: a fresh cluster leaves JetStream requests unanswered
		// until it has elected its meta leader.
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := js.Stream(actx, events.StreamEvents)
		cancel()
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		last := st.CachedInfo().State.LastSeq
		for ; next <= last; next++ {
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			m, err := st.GetMsg(actx, next)
			cancel()
			if err != nil || m.Subject != events.SubjectCertIssued {
				continue
			}
			e, _, err := events.Decode[events.CertIssued](&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
			if err == nil && e.Pod == "demo-0" {
				return e, m.Time
			}
		}
		time.Sleep(time.Second)
	}
	t.Fatal("the demo pod never got a certificate")
	return events.CertIssued{}, time.Time{}
}

func TestComposeStackSurvivesNodeAndSignerLoss(t *testing.T) {
	compose(t, "down", "-v", "--remove-orphans")
	start := time.Now()
	compose(t, "up", "-d")
	t.Logf("docker-compose up -d: %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			fmt.Println(compose(t, "logs", "--tail", "40"))
		}
		compose(t, "down", "-v", "--remove-orphans")
	})

	// The operator's credential, from the host directory the init container wrote.
	nc, err := connect(t, "admin.nk", "_INBOX.admin", 90*time.Second)
	if err != nil {
		t.Fatalf("admin cannot connect to nats-1 on tls://127.0.0.1:4222: %v", err)
	}
	defer nc.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	first, at := firstIssued(ctx, t, nc)
	t.Logf("first certificate for demo-0 %s by %s, %s after up started", first.Serial, first.Signer, at.Sub(start).Round(time.Millisecond))

	ch := make(chan events.CertIssued, 64)
	if _, err := nc.Subscribe(events.SubjectCertIssued, func(m *nats.Msg) {
		if e, _, err := events.Decode[events.CertIssued](m); err == nil && e.Pod == "demo-0" {
			ch <- e
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	// Both replicas answer the queue group: force renewals until each has signed,
	// and check they sign under one root.
	roots := map[string]string{first.Signer: first.RootFingerprint}
	for len(roots) < 2 && ctx.Err() == nil {
		renew(t, nc, ch)
		e := issued(t, ch, 30*time.Second, "renewing until both signers have signed")
		roots[e.Signer] = e.RootFingerprint
	}
	if len(roots) < 2 {
		t.Fatalf("only %v signed", roots)
	}
	if roots["signer-1"] != roots["signer-2"] {
		t.Fatalf("signers disagree on the root: %v", roots)
	}

	t.Run("refusals", func(t *testing.T) { checkRefusals(t, nc) })
	t.Run("routes are mutual TLS", func(t *testing.T) { checkRoutesTLS(t) })

	compose(t, "kill", "nats-2")
	renew(t, nc, ch)
	afterNode := issued(t, ch, 60*time.Second, "after losing nats-2")
	t.Logf("with nats-2 down: %s by %s", afterNode.Serial, afterNode.Signer)

	compose(t, "stop", "signer-1")
	renew(t, nc, ch)
	afterSigner := issued(t, ch, 60*time.Second, "after stopping signer-1")
	if afterSigner.Signer != "signer-2" {
		t.Fatalf("signer-1 is stopped but %s signed", afterSigner.Signer)
	}
	if afterSigner.RootFingerprint != roots["signer-2"] {
		t.Fatalf("root changed across the failures: %s vs %s", afterSigner.RootFingerprint, roots["signer-2"])
	}
}
