module github.com/meshagent/meshagent/pkg/udsock

go 1.26.0
