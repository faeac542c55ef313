package cli

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestSlowOperatorIsNotUnreachable: an operator that accepts the connection and
// answers late is reported slow, with the time waited; one that is not there is
// unreachable; a 503 is quoted with its status.
func TestSlowOperatorIsNotUnreachable(t *testing.T) {
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(release)
	_, err := (&operatorAPI{base: slow.URL, timeout: 200 * time.Millisecond}).Page(context.Background(), url.Values{})
	if err == nil || !strings.Contains(err.Error(), "is slow: connected, no answer after") || strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("slow operator: %v", err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + l.Addr().String()
	_ = l.Close()
	if _, err := (&operatorAPI{base: gone, timeout: time.Second}).Page(context.Background(), url.Values{}); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("no operator: %v", err)
	}

	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "inventory not loaded yet", http.StatusServiceUnavailable)
	}))
	defer busy.Close()
	if _, err := (&operatorAPI{base: busy.URL, timeout: time.Second}).Page(context.Background(), url.Values{}); err == nil ||
		!strings.Contains(err.Error(), "503 Service Unavailable after") || !strings.Contains(err.Error(), "inventory not loaded yet") {
		t.Fatalf("503: %v", err)
	}
}
