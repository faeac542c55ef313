package events

// The launcher's events: one pod's Envoy from start to exit. They go to
// PodEventSubject(pod, PodEventEnvoy*).

// EnvoyStarted is published when the launcher has started Envoy (or its stand-in).
type EnvoyStarted struct {
	Pod     PodRef `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	PID     int    `json:"pid"`
	Version string `json:"version,omitempty"` // first line of `envoy --version`
	Binary  string `json:"binary"`
	// Args are the arguments Envoy was started with (paths and knobs, no secrets).
	Args []string `json:"args,omitempty"`
}

func (EnvoyStarted) EventType() string { return TypeEnvoyStarted }
func (e EnvoyStarted) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.need(e.PID > 0, "pid", "must be positive")
	f.nonEmpty(e.Binary, "binary")
	return f.err()
}

// EnvoyReady is published when Envoy's admin /ready first answers LIVE.
type EnvoyReady struct {
	Pod PodRef `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	PID int    `json:"pid"`
	// StartupMillis is the time from start to ready.
	StartupMillis int64 `json:"startup_ms"`
}

func (EnvoyReady) EventType() string { return TypeEnvoyReady }
func (e EnvoyReady) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.need(e.PID > 0, "pid", "must be positive")
	f.need(e.StartupMillis >= 0, "startup_ms", "must not be negative")
	return f.err()
}

// Drain strategies (EnvoyDraining.Strategy).
const (
	DrainDuration        = "duration"         // wait TERMINATION_DRAIN_DURATION
	DrainZeroConnections = "zero-connections" // EXIT_ON_ZERO_ACTIVE_CONNECTIONS
)

// EnvoyDraining is published when the launcher starts draining Envoy (SIGTERM, or
// /drain or /quitquitquit on the status port).
type EnvoyDraining struct {
	Pod      PodRef `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	PID      int    `json:"pid"`
	Strategy string `json:"strategy"` // DrainDuration or DrainZeroConnections
	// DeadlineMillis bounds the whole drain; Envoy is killed after it.
	DeadlineMillis int64  `json:"deadline_ms"`
	Reason         string `json:"reason,omitempty"` // what asked for the drain
}

func (EnvoyDraining) EventType() string { return TypeEnvoyDraining }
func (e EnvoyDraining) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.need(e.PID > 0, "pid", "must be positive")
	f.need(e.Strategy == DrainDuration || e.Strategy == DrainZeroConnections, "strategy",
		`must be "duration" or "zero-connections"`)
	f.need(e.DeadlineMillis >= 0, "deadline_ms", "must not be negative")
	return f.err()
}

// How a drain ended (EnvoyExited.Drain).
const (
	DrainNone        = "none"       // no drain: Envoy exited by itself (a crash)
	DrainElapsed     = "elapsed"    // TERMINATION_DRAIN_DURATION passed, Envoy stopped
	DrainZeroReached = "zero"       // active connections reached zero, Envoy stopped
	DrainDeadline    = "deadline"   // the hard deadline passed: Envoy was killed
	DrainEnvoyExited = "envoy-exit" // Envoy exited by itself while draining
	DrainQuit        = "quit"       // /quitquitquit: Envoy told to exit at once, no drain
)

// EnvoyExited is published when Envoy's process has ended: its exit code or the
// signal that ended it, and how the drain before it went.
type EnvoyExited struct {
	Pod    PodRef `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	PID    int    `json:"pid"`
	Code   int    `json:"code"`             // -1 when a signal ended it
	Signal string `json:"signal,omitempty"` // e.g. "killed", "segmentation fault"
	// Crashed: Envoy ended without being asked to; the launcher exits too.
	Crashed bool   `json:"crashed"`
	Drain   string `json:"drain"` // Drain* constant
	// ActiveConnections is the last count of downstream connections seen while
	// draining (-1: not polled).
	ActiveConnections int   `json:"active_connections"`
	DrainMillis       int64 `json:"drain_ms,omitempty"`
}

func (EnvoyExited) EventType() string { return TypeEnvoyExited }
func (e EnvoyExited) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.need(e.PID > 0, "pid", "must be positive")
	f.nonEmpty(e.Drain, "drain")
	f.need(e.ActiveConnections >= -1, "active_connections", "must be -1 or more")
	return f.err()
}

// PodParts is published by the launcher when the pod's other parts (sds-edge with
// its certificate and trust bundle, xds-relay) stop serving after Envoy started,
// and again when they are back: Missing names what is missing, empty when Healthy.
type PodParts struct {
	Pod     PodRef   `json:"pod" jsonschema:"pattern=^[a-z0-9-]+/[A-Za-z0-9._-]+$"`
	Healthy bool     `json:"healthy"`
	Missing []string `json:"missing,omitempty"`
}

func (PodParts) EventType() string { return TypePodParts }
func (e PodParts) Validate() error {
	var f fields
	f.pod(e.Pod, "pod", true)
	f.need(e.Healthy == (len(e.Missing) == 0), "missing", "must name what is missing exactly when not healthy")
	f.need(len(e.Missing) <= 16, "missing", "at most 16 entries")
	return f.err()
}
