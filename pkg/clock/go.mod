module github.com/meshagent/meshagent/pkg/clock

go 1.26.0
