package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryBinaryListsItsFlags runs each built service binary with -h: it exits 0
// and prints every flag with its env var and default (a few known ones checked).
func TestEveryBinaryListsItsFlags(t *testing.T) {
	tests := []struct {
		bin  string
		want []string
	}{
		{"signer", []string{"-ca-kek-file", "env CA_KEK_FILE", "-nats-url", "env NATS_URL", "-http-addr"}},
		{"rotator", []string{"-grace-ratio", "env SECRET_GRACE_PERIOD_RATIO", "-nats-nkey", "env NATS_NKEY"}},
		{"operator", []string{"-http-addr", "-bucket-replicas", "env INVENTORY_REPLICAS", "-audit-file", "-nats-nkey", "env NATS_NKEY"}},
		{"sds-edge", []string{"-trust-anchors-file", "env TRUST_ANCHORS_FILE", "-pod", "-nats-token-file", "env NATS_TOKEN_FILE"}},
		{"xds-relay", []string{"-pod", "-discovery-address", "-nats-url"}},
		{"launcher", []string{"-http-addr", "default "}},
	}
	for _, tt := range tests {
		t.Run(tt.bin, func(t *testing.T) {
			out, err := exec.Command(filepath.Join(binDir, tt.bin), "-h").CombinedOutput()
			if err != nil {
				t.Fatalf("%s -h: %v\n%s", tt.bin, err, out)
			}
			s := string(out)
			if strings.Contains(s, "flag: help requested") || !strings.HasPrefix(s, "Usage of "+tt.bin) {
				t.Fatalf("%s -h printed no usage:\n%s", tt.bin, s)
			}
			for _, w := range tt.want {
				if !strings.Contains(s, w) {
					t.Errorf("%s -h lacks %q:\n%s", tt.bin, w, s)
				}
			}
			if n, e := strings.Count(s, "\n  -"), strings.Count(s, "\tenv "); n == 0 || n != e {
				t.Errorf("%s -h: %d flags but %d env/default lines", tt.bin, n, e)
			}
		})
	}
}
