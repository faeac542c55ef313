package kubeapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestAnswersPodReadsAsTheAPIServerDoes(t *testing.T) {
	s := New("secret")
	s.Add(Pod{Namespace: "istio-system", Name: "ztunnel-0", ServiceAccount: "ztunnel", Node: "n1"})
	s.Add(Pod{Namespace: "default", Name: "web-0", ServiceAccount: "web", Node: "n1"})
	s.Add(Pod{Namespace: "default", Name: "db-0", ServiceAccount: "db", Node: "n2"})
	s.Add(Pod{Namespace: "default", Name: "db-0", ServiceAccount: "db", Node: "n1"}) // moved: replaces
	srv := httptest.NewTLSServer(s)
	defer srv.Close()
	get := func(path, token string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: not JSON: %s", path, b)
		}
		return resp.StatusCode, v
	}
	if code, v := get("/api/v1/namespaces/istio-system/pods/ztunnel-0", "secret"); code != 200 ||
		v["spec"].(map[string]any)["nodeName"] != "n1" || v["status"].(map[string]any)["phase"] != "Running" {
		t.Fatalf("get pod: %d %v", code, v)
	}
	if code, v := get("/api/v1/namespaces/default/pods?fieldSelector=spec.nodeName%3Dn1", "secret"); code != 200 || len(v["items"].([]any)) != 2 {
		t.Fatalf("list on n1: %d %v, want web-0 and db-0", code, v)
	}
	if code, v := get("/api/v1/namespaces/default/pods?fieldSelector=spec.nodeName%3Dn2", "secret"); code != 200 || len(v["items"].([]any)) != 0 {
		t.Fatalf("list on n2: %d %v, want none (db-0 moved)", code, v)
	}
	for _, c := range []struct {
		path, token string
		code        int
	}{
		{"/api/v1/namespaces/default/pods/web-0", "", http.StatusUnauthorized},
		{"/api/v1/namespaces/default/pods/web-0", "wrong", http.StatusUnauthorized},
		{"/api/v1/namespaces/default/pods/nope", "secret", http.StatusNotFound},
		{"/api/v1/namespaces/default/secrets/x", "secret", http.StatusNotFound},
		{"/api/v1/namespaces/default/pods?fieldSelector=metadata.name%3Dweb-0", "secret", http.StatusBadRequest},
	} {
		if code, v := get(c.path, c.token); code != c.code || v["kind"] != "Status" {
			t.Errorf("%s (token %q): %d %v, want %d and a Status", c.path, c.token, code, v, c.code)
		}
	}
}
