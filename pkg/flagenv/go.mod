module github.com/meshagent/meshagent/pkg/flagenv

go 1.26.0
