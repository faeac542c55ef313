package renewal

import (
	"time"

	"github.com/meshagent/meshagent/services/rotator/internal/config"
	"github.com/meshagent/meshagent/services/rotator/internal/schedule"
)

// FromConfig maps the service configuration to Options.
func FromConfig(c config.Config) Options {
	return Options{
		Schedule: schedule.Config{GraceRatio: c.Renew.GraceRatio, Jitter: c.Renew.GraceJitter,
			RetryAfter: c.Renew.RetryAfter, RetryMax: c.Renew.RetryMax, Rate: c.Renew.Rate, Burst: c.Renew.Burst},
		Instance: c.HA.Instance, LeaseTTL: c.HA.LeaseTTL, LeaseBucket: c.HA.LeaseBucket,
		Consumer: c.Store.Consumer, Bucket: c.Store.Bucket, Replicas: c.Store.Replicas,
		BundleRefresh: time.Second,
	}
}
