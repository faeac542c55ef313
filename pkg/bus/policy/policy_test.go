package policy_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nkeys"
)

func TestCredentialsGeneratedOnceAndPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	c, err := policy.LoadOrGenerate(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := []string{c.IssuerFile()}
	for _, r := range policy.Users {
		files = append(files, c.SeedFile(r))
	}
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, fi, err)
		}
	}
	again, err := policy.LoadOrGenerate(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range policy.Users {
		if again.Keys.Users[r] != c.Keys.Users[r] {
			t.Fatalf("%s key replaced on reload", r)
		}
	}
	if again.Keys.Issuer != c.Keys.Issuer {
		t.Fatal("issuer replaced on reload")
	}
	if err := c.Keys.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestReadSeedRefusesLooseOrWrongKeys(t *testing.T) {
	c, err := policy.LoadOrGenerate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.ReadSeed(c.IssuerFile(), nkeys.PrefixByteUser); err == nil {
		t.Fatal("account seed accepted as a user seed")
	}
	if err := os.Chmod(c.SeedFile(policy.Audit), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := policy.ReadSeed(c.SeedFile(policy.Audit), nkeys.PrefixByteUser); !errors.Is(err, policy.ErrSecretMode) || !strings.Contains(err.Error(), "0644") {
		t.Fatalf("world-readable seed: %v", err)
	}
	// A corrupt seed is an error, not a reason to generate a new one over it.
	if err := os.WriteFile(c.SeedFile(policy.Signer), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := policy.LoadOrGenerate(c.Dir); err == nil {
		t.Fatal("corrupt seed accepted")
	}
}

func TestRenderNamesEveryUserAndDeniesByDefault(t *testing.T) {
	c, err := policy.LoadOrGenerate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	conf, err := policy.Render(c.Keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range policy.Users {
		if !strings.Contains(conf, c.Keys.Users[r]) {
			t.Errorf("%s missing", r)
		}
	}
	for _, want := range []string{"auth_callout", c.Keys.Issuer, "jetstream: enabled", `"meshagent.rpc.sign.> signer"`} {
		if !strings.Contains(conf, want) {
			t.Errorf("config lacks %s", want)
		}
	}
	if strings.Contains(conf, `allow: [">"`) || strings.Contains(conf, `"meshagent.>"`) {
		t.Error("a role is allowed everything")
	}
	bad := c.Keys
	bad.Issuer = c.Keys.Users[policy.Admin]
	if _, err := policy.Render(bad); err == nil {
		t.Fatal("a user key accepted as issuer")
	}
}

func TestPodPermissionsAreItsOwn(t *testing.T) {
	p, err := policy.ForPod(events.PodRef{Namespace: "shop", Name: "web.v1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append(p.Publish, p.Subscribe...) {
		// trust.federated is a broadcast like trust.changed (endorsed by the CA, read by every pod).
		if s == events.TrustFederatedWildcard || s == events.TrustFederatedLastWildcard {
			continue
		}
		// The replica form of its sign subject: any replica, the one subject.
		if rest, ok := strings.CutPrefix(s, "meshagent.rpc.signer.*."); ok && !strings.ContainsAny(rest, "*>") && strings.HasSuffix(rest, ".shop.web~v1") {
			continue
		}
		if strings.Contains(s, "*") || (strings.HasSuffix(s, ">") && !strings.Contains(s, ".shop.web~v1.")) {
			t.Errorf("pod permission %q reaches beyond the pod", s)
		}
	}
	if !slices.Contains(p.Subscribe, "_INBOX.pod.shop.web~v1.>") || p.Responses {
		t.Errorf("pod permissions %+v", p)
	}
	for _, id := range []events.PodRef{{}, {Namespace: "shop"}, {Name: "web-0"}, {Namespace: "shop", Name: "a.>"}, {Namespace: "shop", Name: "a*"},
		{Namespace: "shop", Name: "a b"}, {Namespace: "*", Name: "a"}, {Namespace: "sh.op", Name: "a"}, {Namespace: ">", Name: "a"}} {
		if _, err := policy.ForPod(id); err == nil {
			t.Errorf("pod %+v accepted", id)
		}
	}
	if _, err := policy.For(policy.Pod); err == nil {
		t.Error("pod role has fixed permissions")
	}
}
