module github.com/meshagent/meshagent/pkg/testkit

go 1.26.0
