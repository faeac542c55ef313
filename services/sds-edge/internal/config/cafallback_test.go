package config

import (
	"strings"
	"testing"
)

// TestBusInBackgroundWithAGRPCCA: a CA reachable without the bus (-ca-addr,
// -ca-fallback-addr) makes the bus connection a background one; the two
// addresses together are refused, naming the flag.
func TestBusInBackgroundWithAGRPCCA(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		env        map[string]string
		background bool
		wantErr    string
	}{
		{name: "bus only", args: nil},
		{name: "ca-addr", args: []string{"-ca-addr", "istiod:15012"}, background: true},
		{name: "fallback from env", env: map[string]string{"CA_FALLBACK_ADDR": "signer:15012"}, background: true},
		{name: "both", args: []string{"-ca-addr", "istiod:15012", "-ca-fallback-addr", "signer:15012"}, wantErr: "-ca-fallback-addr: not with -ca-addr"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(append([]string{"-pod", "web-0"}, tc.args...), func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Load = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Bus.Background != tc.background || c.Process().Bus == nil {
				t.Fatalf("bus background = %v, want %v", c.Bus.Background, tc.background)
			}
		})
	}
}
