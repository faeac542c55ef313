// Package obs gives every service the same logging and the same operational HTTP
// endpoints: /healthz, /readyz and /metrics (Prometheus text format).
package obs

import (
	"io"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/flagenv"
)

// LogConfig selects the log level and format.
type LogConfig struct {
	Level string
	JSON  bool
}

// Bind registers -log-level (LOG_LEVEL) and -log-json (LOG_JSON) on fs. The level
// already in c is the default; empty means info.
func (c *LogConfig) Bind(fs *flagenv.Set) {
	def := c.Level
	if def == "" {
		def = "info"
	}
	fs.String(&c.Level, "log-level", "LOG_LEVEL", def, "trace, debug, info, warn or error")
	fs.Bool(&c.JSON, "log-json", "LOG_JSON", false, "log JSON lines")
}

// Validate reports an unknown level.
func (c LogConfig) Validate() error {
	if hclog.LevelFromString(c.Level) == hclog.NoLevel {
		return errInvalidLevel(c.Level)
	}
	return nil
}

type errInvalidLevel string

func (e errInvalidLevel) Error() string {
	return "-log-level: unknown level " + string(e) + " (want trace, debug, info, warn or error)"
}

// NewLogger returns the root logger of a process.
func NewLogger(name string, c LogConfig, w io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:            name,
		Level:           hclog.LevelFromString(c.Level),
		JSONFormat:      c.JSON,
		Output:          w,
		IncludeLocation: false,
	})
}
