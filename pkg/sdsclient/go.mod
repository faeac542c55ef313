module github.com/meshagent/meshagent/pkg/sdsclient

go 1.26.0
