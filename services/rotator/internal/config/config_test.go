package config

import (
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/tests/testkit"
)

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(t *testing.T, c Config)
		wantErr []string
	}{
		{name: "defaults", args: []string{"-instance", "r0"}, check: func(t *testing.T, c Config) {
			if c.Renew.GraceRatio != 0.5 || c.Renew.GraceJitter != 0.01 || c.Renew.Rate != 500 || c.HA.LeaseTTL != 5*time.Second {
				t.Fatalf("defaults: %+v", c.Renew)
			}
			if c.Bus.Name != "rotator/r0" {
				t.Fatalf("bus name %q", c.Bus.Name)
			}
		}},
		{name: "istio env names", args: []string{"-instance", "r0"},
			env: map[string]string{"SECRET_GRACE_PERIOD_RATIO": "0.3", "SECRET_GRACE_PERIOD_RATIO_JITTER": "0.1", "RENEW_RATE_LIMIT": "50", "ROTATOR_LEASE_TTL": "2s"},
			check: func(t *testing.T, c Config) {
				if c.Renew.GraceRatio != 0.3 || c.Renew.GraceJitter != 0.1 || c.Renew.Rate != 50 || c.HA.LeaseTTL != 2*time.Second {
					t.Fatalf("env not applied: %+v %v", c.Renew, c.HA.LeaseTTL)
				}
			}},
		{name: "flag beats env", args: []string{"-instance", "r0", "-grace-ratio", "0.4"},
			env: map[string]string{"SECRET_GRACE_PERIOD_RATIO": "0.3"},
			check: func(t *testing.T, c Config) {
				if c.Renew.GraceRatio != 0.4 {
					t.Fatalf("ratio %v", c.Renew.GraceRatio)
				}
			}},
		{name: "every problem at once", args: []string{"-instance", "r0", "-grace-ratio", "1.5", "-grace-jitter", "-1", "-rate", "0",
			"-burst", "0", "-retry-after", "0s", "-lease-ttl", "10ms", "-bucket", "a.b", "-js-replicas", "0"},
			wantErr: []string{"-grace-ratio", "-grace-jitter", "-rate", "-burst", "-retry-after", "-lease-ttl", "-bucket", "-js-replicas"}},
		{name: "bad env value names the flag", args: []string{"-instance", "r0"}, env: map[string]string{"RENEW_RETRY_AFTER": "30"},
			wantErr: []string{"RENEW_RETRY_AFTER", "-retry-after"}},
		{name: "same bucket twice", args: []string{"-instance", "r0", "-bucket", "x", "-lease-bucket", "x"}, wantErr: []string{"must differ"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.args, testkit.Env(tc.env))
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatal("no error")
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error does not name %s: %v", w, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestProcessIsWhatTheLifecycleReads(t *testing.T) {
	c, err := Load([]string{"-instance", "r0", "-http-addr", "127.0.0.1:9"}, testkit.Env(nil))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Process()
	if p.Name != "rotator" || p.HTTP != "127.0.0.1:9" || p.Bus == nil || p.Bus.Name != "rotator/r0" || p.Log != c.Log {
		t.Fatalf("process %+v", p)
	}
}
