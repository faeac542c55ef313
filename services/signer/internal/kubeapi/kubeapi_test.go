package kubeapi

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestClientReadsItsTokenEachTimeAndBoundsAnswers: over real HTTPS with the
// server's root as CAFile, each request carries the token file as it is then (the
// kubelet rotates it), and an answer over maxBody is an error, not a truncation.
func TestClientReadsItsTokenEachTimeAndBoundsAnswers(t *testing.T) {
	var seen []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Header.Get("Authorization")+" "+r.Header.Get("Content-Type"))
		if r.URL.Path == "/big" {
			_, _ = w.Write([]byte(strings.Repeat("x", 100)))
			return
		}
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{URL: srv.URL + "/", CAFile: ca, BearerFile: tok}, 5*time.Second, 64, "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if code, raw, err := c.Do(ctx, http.MethodPost, "/x", []byte(`{}`), "application/json"); err != nil || code != 200 || string(raw) != `{"ok":true}` {
		t.Fatalf("%d %q %v", code, raw, err)
	}
	if err := os.WriteFile(tok, []byte("second"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Do(ctx, http.MethodGet, "/x", nil, ""); err != nil {
		t.Fatal(err)
	}
	if want := []string{"Bearer first application/json", "Bearer second "}; len(seen) != 2 || seen[0] != want[0] || seen[1] != want[1] {
		t.Fatalf("requests carried %q, want %q", seen, want)
	}
	if _, _, err := c.Do(ctx, http.MethodGet, "/big", nil, ""); err == nil || !strings.Contains(err.Error(), "larger than 64 bytes") {
		t.Fatalf("a 100-byte answer with a 64-byte bound: %v", err)
	}
	// The control: without the server's root the handshake fails.
	bare, err := New(Config{URL: srv.URL}, 5*time.Second, 64, "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := bare.Do(ctx, http.MethodGet, "/x", nil, ""); err == nil {
		t.Fatal("a server of an unknown root was trusted")
	}
	if _, err := New(Config{URL: srv.URL, CAFile: tok}, time.Second, 64, "test"); err == nil || !strings.Contains(err.Error(), "test: no PEM certificate") {
		t.Fatalf("a CA file without a certificate: %v", err)
	}
	if got := Brief([]byte("  "+strings.Repeat("y", 10)+" "), 4); got != "yyyy..." {
		t.Fatalf("Brief %q", got)
	}
}
