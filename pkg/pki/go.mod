module github.com/meshagent/meshagent/pkg/pki

go 1.26.0

require (
	github.com/meshagent/meshagent/pkg/testkit v0.0.0
	github.com/spiffe/go-spiffe/v2 v2.9.0
)

replace github.com/meshagent/meshagent/pkg/testkit => ../testkit
