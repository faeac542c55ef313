package main

// The smaller holes of issue 22, tried against a running local stack of the real
// binaries: the CA material a pod's proxy could be made to serve, a malformed
// inventory record, a DNS-rebound dashboard and a web page posting to the status
// port. Each asserts on what the stack still holds or serves.

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/devstack"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/sdsclient"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestLocalStackSmallHoles(t *testing.T) {
	dir := testkit.ShortDir(t)
	startStack(t, devstack.Config{Dir: dir, Pods: 2, LeafTTL: time.Hour})
	st, err := stackfile.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Pods {
		podCert(t, dir, p.ID)
	}
	t.Run("CA material outside every pod, owner only", func(t *testing.T) { caMaterialKeptApart(t, st) })
	t.Run("file-cert for the partner signer's CA key", func(t *testing.T) { fileCertCAKey(t, st) })
	t.Run("malformed inventory record", func(t *testing.T) { malformedInventoryRecord(t, st) })
	t.Run("DNS-rebound dashboard", func(t *testing.T) { reboundDashboard(t, st) })
	t.Run("web page posts to the status port", func(t *testing.T) { pagePostsToStatusPort(t, st) })
}

// caMaterialKeptApart: every private file of the stack is 0600 in a 0700
// directory, and none is inside a pod root (nor a pod root inside them).
func caMaterialKeptApart(t *testing.T, st *stackfile.Stack) {
	var private []string
	for _, d := range devstack.SecretDirs {
		err := filepath.WalkDir(filepath.Join(st.Dir, d), func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := e.Info()
			if err != nil {
				return err
			}
			switch {
			case e.IsDir():
				if fi.Mode().Perm() != 0o700 {
					t.Errorf("%s: %#o, want 0700", p, fi.Mode().Perm())
				}
			case strings.HasSuffix(p, "key.pem") || strings.HasSuffix(p, ".nk") || strings.HasSuffix(p, "kek") || strings.HasSuffix(p, "token"):
				private = append(private, p)
				if fi.Mode().Perm() != 0o600 {
					t.Errorf("%s: %#o, want 0600", p, fi.Mode().Perm())
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	partnerKey := filepath.Join(st.Dir, "secrets/signers", devstack.PartnerSigner, "ca-key.pem")
	if !contains(private, partnerKey) || !contains(private, filepath.Join(st.Dir, "secrets/ca-kek")) {
		t.Fatalf("the walk missed the CA material: %v", private)
	}
	for _, p := range st.Pods {
		root, err := filepath.EvalSymlinks(p.Root)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range private {
			real, err := filepath.EvalSymlinks(f)
			if err != nil {
				t.Fatal(err)
			}
			if rel, err := filepath.Rel(root, real); err == nil && !strings.HasPrefix(rel, "..") {
				t.Errorf("%s is inside pod %s's root", f, p.ID)
			}
		}
		for _, d := range devstack.SecretDirs {
			if rel, err := filepath.Rel(filepath.Join(st.Dir, d), root); err == nil && !strings.HasPrefix(rel, "..") {
				t.Errorf("pod %s's root is inside %s", p.ID, d)
			}
		}
	}
}

// fileCertCAKey: a pod's proxy asks its sds-edge for the partner signer's CA
// certificate and key, by absolute path, by ../ from the pod's /etc/certs, and by
// a symlink in it: NotFound each time, and no secret holds the key.
func fileCertCAKey(t *testing.T, st *stackfile.Stack) {
	pod := st.Pods[0]
	ca := filepath.Join(st.Dir, "secrets/signers", devstack.PartnerSigner)
	keyPEM, err := os.ReadFile(filepath.Join(ca, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(pod.Root, "etc/certs")
	up, err := filepath.Rel(certs, ca)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ca, filepath.Join(certs, "partner")); err != nil {
		t.Fatal(err)
	}
	cc, err := sdsclient.DialUnix(context.Background(), pod.SDSSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{
		"file-cert:" + filepath.Join(ca, "ca-cert.pem") + "~" + filepath.Join(ca, "ca-key.pem"),
		"file-cert:" + certs + "/" + filepath.Join(up, "ca-cert.pem") + "~" + certs + "/" + filepath.Join(up, "ca-key.pem"),
		"file-cert:etc/certs/partner/ca-cert.pem~etc/certs/partner/ca-key.pem",
		"file-root:" + filepath.Join(ca, "root-cert.pem"),
	} {
		got, err := sdsclient.Fetch(ctx, cc, pod.NodeID, name)
		if status.Code(errors.Unwrap(err)) != codes.NotFound || !strings.Contains(err.Error(), "outside the directories") {
			t.Errorf("%s: %v", name, err)
		}
		for _, s := range got {
			if strings.Contains(string(s.PrivateKey), strings.TrimSpace(string(keyPEM))) {
				t.Fatalf("%s served the CA key", name)
			}
		}
	}
	// The pod's own identity is still served.
	if got, err := sdsclient.Fetch(ctx, cc, pod.NodeID, "default"); err != nil || !got["default"].IsCertificate() {
		t.Fatalf("default: %v", err)
	}
}

// malformedInventoryRecord: garbage written with the inventory credential; meshctl
// certs still lists every pod and says one record was skipped, status too.
func malformedInventoryRecord(t *testing.T, st *stackfile.Stack) {
	kp, err := policy.ReadSeed(filepath.Join(st.Dir, "secrets", string(policy.Inventory)+".nk"), nkeys.PrefixByteUser)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	nc, err := nats.Connect(st.NATSURL, nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(policy.Inbox(policy.Inventory, events.PodRef{})), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, policy.BucketInventory)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "pod.zz-garbage.64656661756c74", []byte("\x00\x01 not a record")); err != nil {
		t.Fatal(err)
	}
	// certs asks the operator, whose index follows the bucket through a watch: a
	// moment after the write.
	var out string
	testkit.Eventually(t, "certs names the skipped record", func() bool {
		out, err = meshctl(t, "certs", "-dir", st.Dir)
		return err != nil || strings.Contains(out, "skipped")
	})
	if err != nil {
		t.Fatalf("certs failed on one bad record: %v\n%s", err, out)
	}
	for _, p := range st.Pods {
		if !strings.Contains(out, p.ID) {
			t.Errorf("certs lacks %s:\n%s", p.ID, out)
		}
	}
	if !strings.Contains(out, "warning: 1 malformed inventory record(s) skipped: pod.zz-garbage.64656661756c74") {
		t.Errorf("certs does not say what it skipped:\n%s", out)
	}
	out, _ = meshctl(t, "status", "-dir", st.Dir)
	if !strings.Contains(out, "1 malformed record(s) skipped") || !strings.Contains(out, "2 up, 0 down") {
		t.Errorf("status:\n%s", out)
	}
	if err := kv.Delete(ctx, "pod.zz-garbage.64656661756c74"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "certs no longer names the deleted record", func() bool {
		out, err = meshctl(t, "certs", "-dir", st.Dir)
		return err == nil && !strings.Contains(out, "skipped")
	})
}

// reboundDashboard: the dashboard asked for by another name gets nothing.
func reboundDashboard(t *testing.T, st *stackfile.Stack) {
	for _, path := range []string{"/api/inventory", "/metrics", "/"} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+st.Dashboard+path, nil)
		req.Host = "evil.example:" + portOfAddr(st.Dashboard)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusMisdirectedRequest || strings.Contains(string(body), st.Pods[0].ID) ||
			strings.Contains(string(body), "meshagent_fleet") {
			t.Errorf("%s as evil.example: %d %s", path, resp.StatusCode, body)
		}
	}
	if code, body := testkit.HTTPGet("http://" + st.Dashboard + "/api/inventory"); code != 200 || !strings.Contains(body, st.Pods[0].ID) {
		t.Fatalf("the dashboard by its own address: %d %s", code, body)
	}
}

// pagePostsToStatusPort: a form posted from a web page to /drain and
// /quitquitquit leaves the pod's Envoy running and ready.
func pagePostsToStatusPort(t *testing.T, st *stackfile.Stack) {
	pod := st.Pods[1]
	base := "http://" + pod.Status
	testkit.Eventually(t, "pod ready", func() bool { code, _ := testkit.HTTPGet(base + "/healthz/ready"); return code == 200 })
	for _, path := range []string{"/drain", "/quitquitquit"} {
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader("a=1"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", "https://evil.example")
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("POST %s from a page: %d", path, resp.StatusCode)
		}
	}
	// The same launcher process runs (a quit would have ended it, and the
	// supervisor restarted another) and its Envoy is ready, not draining.
	pid := 0
	for _, p := range st.Processes {
		if p.HTTP == pod.HTTP["launcher"] {
			pid = p.PID
		}
	}
	if pid == 0 {
		t.Fatalf("no launcher process of %s in %+v", pod.ID, st.Processes)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("launcher %d: %v", pid, err)
	}
	if code, body := testkit.HTTPGet(base + "/healthz/ready"); code != 200 {
		t.Fatalf("pod %s not ready after the page's posts: %d %s", pod.ID, code, body)
	}
}

func portOfAddr(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}
