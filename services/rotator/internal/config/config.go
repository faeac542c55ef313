// Package config reads the rotator's configuration: flags, then env vars, then defaults.
package config

import (
	"os"
	"regexp"
	"time"

	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/lifecycle"
	"github.com/meshagent/meshagent/pkg/obs"
)

// Config is the rotator's whole configuration.
type Config struct {
	Log    obs.LogConfig
	Bus    bus.Config
	Listen struct {
		HTTP string // /healthz, /readyz, /metrics
	}

	Renew struct {
		GraceRatio  float64       // SECRET_GRACE_PERIOD_RATIO
		GraceJitter float64       // SECRET_GRACE_PERIOD_RATIO_JITTER
		Rate        float64       // renew-due per second, fleet-wide
		Burst       int           // renew-due at once
		RetryAfter  time.Duration // re-send when no cert.issued came by then
		RetryMax    time.Duration // cap of the doubling backoff
	}
	HA struct {
		Instance    string        // unique per replica
		LeaseTTL    time.Duration // crash failover <= LeaseTTL * 7/5
		LeaseBucket string
	}
	Store struct {
		Bucket   string
		Consumer string
		Replicas int
	}
}

// Default returns the defaults.
func Default() Config {
	var c Config
	c.Log = obs.LogConfig{Level: "info"}
	c.Bus.URL = bus.DefaultURL
	c.Listen.HTTP = "127.0.0.1:15093"
	c.Renew.GraceRatio = 0.5
	c.Renew.GraceJitter = 0.01
	// A P-256 signer core signs ~3,800 CSRs/s (PITFALLS.md); 500/s leaves most of one
	// core to new pods while a 100,000-pod root rotation finishes in under 4 minutes.
	c.Renew.Rate = 500
	c.Renew.Burst = 50
	c.Renew.RetryAfter = 30 * time.Second
	c.Renew.RetryMax = 5 * time.Minute
	c.HA.Instance, _ = os.Hostname()
	c.HA.LeaseTTL = 5 * time.Second
	c.HA.LeaseBucket = "meshagent_rotator_lease"
	c.Store.Bucket = "meshagent_rotator"
	c.Store.Consumer = "rotator"
	c.Store.Replicas = 1
	return c
}

// Load reads flags and env vars over the defaults and validates the result.
func Load(args []string, getenv func(string) string) (Config, error) {
	c := Default()
	fs := c.bind(getenv)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.Bus.Name = "rotator/" + c.HA.Instance
	c.Bus.AsService(policy.Rotator)
	return c, c.Validate()
}

func (c *Config) bind(getenv func(string) string) *flagenv.Set {
	fs := flagenv.New("rotator", getenv)
	c.Log.Bind(fs)
	c.Bus.Bind(fs)
	fs.String(&c.Listen.HTTP, "http-addr", "HTTP_ADDR", c.Listen.HTTP, "health and metrics listen address")
	fs.Float64(&c.Renew.GraceRatio, "grace-ratio", "SECRET_GRACE_PERIOD_RATIO", c.Renew.GraceRatio, "renew when this fraction of a certificate's lifetime is left")
	fs.Float64(&c.Renew.GraceJitter, "grace-jitter", "SECRET_GRACE_PERIOD_RATIO_JITTER", c.Renew.GraceJitter, "± jitter added to the grace ratio per certificate")
	fs.Float64(&c.Renew.Rate, "rate", "RENEW_RATE_LIMIT", c.Renew.Rate, "fleet-wide renew-due per second")
	fs.Int(&c.Renew.Burst, "burst", "RENEW_RATE_BURST", c.Renew.Burst, "renew-due that may go at once")
	fs.Duration(&c.Renew.RetryAfter, "retry-after", "RENEW_RETRY_AFTER", c.Renew.RetryAfter, "re-send renew-due when no new certificate came this long after it")
	fs.Duration(&c.Renew.RetryMax, "retry-max", "RENEW_RETRY_MAX", c.Renew.RetryMax, "cap of the doubling retry backoff")
	fs.String(&c.HA.Instance, "instance", "ROTATOR_INSTANCE", c.HA.Instance, "this replica's unique name (default: hostname)")
	fs.Duration(&c.HA.LeaseTTL, "lease-ttl", "ROTATOR_LEASE_TTL", c.HA.LeaseTTL, "leader lease TTL; crash failover takes at most 1.4x this")
	fs.String(&c.HA.LeaseBucket, "lease-bucket", "ROTATOR_LEASE_BUCKET", c.HA.LeaseBucket, "KV bucket of the leader lease")
	fs.String(&c.Store.Bucket, "bucket", "ROTATOR_BUCKET", c.Store.Bucket, "KV bucket of the schedule")
	fs.String(&c.Store.Consumer, "consumer", "ROTATOR_CONSUMER", c.Store.Consumer, "durable consumer name on the event stream")
	fs.Int(&c.Store.Replicas, "js-replicas", "ROTATOR_JS_REPLICAS", c.Store.Replicas, "JetStream replicas of the buckets and the consumer")
	return fs
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Validate reports every problem at once, naming the flag.
func (c Config) Validate() error {
	var p flagenv.Problems
	p.Add(c.Log.Validate())
	p.Add(c.Bus.Validate())
	p.Check(c.Listen.HTTP != "", "-http-addr: required")
	p.Check(c.Renew.GraceRatio > 0 && c.Renew.GraceRatio < 1, "-grace-ratio: must be between 0 and 1 (exclusive)")
	p.Check(c.Renew.GraceJitter >= 0 && c.Renew.GraceJitter < 1, "-grace-jitter: must be in [0, 1)")
	p.Check(c.Renew.Rate > 0, "-rate: must be positive")
	p.Check(c.Renew.Burst >= 1, "-burst: must be at least 1")
	p.Check(c.Renew.RetryAfter > 0, "-retry-after: must be positive")
	p.Check(c.Renew.RetryMax >= c.Renew.RetryAfter, "-retry-max: must be at least -retry-after")
	p.Check(c.HA.Instance != "", "-instance: required (no hostname to default to)")
	p.Check(len(c.HA.Instance) <= 128, "-instance: at most 128 characters")
	p.Check(c.HA.LeaseTTL >= 500*time.Millisecond, "-lease-ttl: must be at least 500ms")
	p.Check(namePattern.MatchString(c.HA.LeaseBucket), "-lease-bucket: want [A-Za-z0-9_-]+")
	p.Check(namePattern.MatchString(c.Store.Bucket), "-bucket: want [A-Za-z0-9_-]+")
	p.Check(c.Store.Bucket != c.HA.LeaseBucket, "-bucket and -lease-bucket: must differ")
	p.Check(namePattern.MatchString(c.Store.Consumer), "-consumer: want [A-Za-z0-9_-]+")
	p.Check(c.Store.Replicas >= 1 && c.Store.Replicas <= 5, "-js-replicas: must be 1 to 5")
	return p.Err()
}

// Process is what the lifecycle reads: the logger, the health and metrics
// address, and the bus.
func (c Config) Process() lifecycle.Process {
	return lifecycle.Process{Name: "rotator", Log: c.Log, HTTP: c.Listen.HTTP, Bus: &c.Bus}
}
