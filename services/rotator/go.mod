module github.com/meshagent/meshagent/services/rotator

go 1.26.0

require (
	github.com/meshagent/meshagent/pkg/bus v0.0.0
	github.com/meshagent/meshagent/pkg/events v0.0.0
	github.com/meshagent/meshagent/pkg/flagenv v0.0.0
	github.com/meshagent/meshagent/pkg/obs v0.0.0
	github.com/meshagent/meshagent/pkg/pki v0.0.0
)

replace (
	github.com/meshagent/meshagent/pkg/bus => ../../pkg/bus
	github.com/meshagent/meshagent/pkg/events => ../../pkg/events
	github.com/meshagent/meshagent/pkg/flagenv => ../../pkg/flagenv
	github.com/meshagent/meshagent/pkg/obs => ../../pkg/obs
	github.com/meshagent/meshagent/pkg/pki => ../../pkg/pki
)
