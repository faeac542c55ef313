module github.com/meshagent/meshagent/pkg/udsock

go 1.26.0

require github.com/meshagent/meshagent/pkg/testkit v0.0.0

replace github.com/meshagent/meshagent/pkg/testkit => ../testkit
