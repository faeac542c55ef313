//go:build compose

package compose

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
)

const project = "meshagent-compose-test"

func compose(t *testing.T, args ...string) string {
	t.Helper()
	bin := strings.Fields(os.Getenv("COMPOSE"))
	if len(bin) == 0 {
		bin = []string{"docker-compose"}
	}
	full := append(bin[1:], append([]string{"-p", project, "-f", "compose.yaml"}, args...)...)
	out, err := exec.Command(bin[0], full...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", bin[0], full, err, out)
	}
	return string(out)
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

func TestComposeStackSurvivesNodeAndSignerLoss(t *testing.T) {
	compose(t, "down", "-v", "--remove-orphans")
	compose(t, "up", "-d")
	t.Cleanup(func() {
		if t.Failed() {
			fmt.Println(compose(t, "logs", "--tail", "40"))
		}
		compose(t, "down", "-v", "--remove-orphans")
	})

	var nc *nats.Conn
	deadline := time.Now().Add(90 * time.Second)
	for {
		var err error
		nc, err = nats.Connect("nats://127.0.0.1:4222", nats.MaxReconnects(-1))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-1 not reachable on 127.0.0.1:4222: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	defer nc.Close()

	ch := make(chan events.CertIssued, 64)
	_, err := nc.Subscribe(events.SubjectCertIssued, func(m *nats.Msg) {
		if e, _, err := events.Decode[events.CertIssued](m); err == nil && e.Pod == "demo-0" {
			ch <- e
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// The pod may have its first certificate already: force one so that we see it.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var first events.CertIssued
	for first.Serial == "" && ctx.Err() == nil {
		renew(t, nc, ch)
		select {
		case first = <-ch:
		case <-time.After(5 * time.Second):
		}
	}
	if first.Serial == "" {
		t.Fatal("the demo pod never got a certificate")
	}
	t.Logf("first certificate %s by %s", first.Serial, first.Signer)

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
