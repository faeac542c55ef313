module github.com/meshagent/meshagent/cmd/meshctl

go 1.26.0
