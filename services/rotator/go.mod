module github.com/meshagent/meshagent/services/rotator

go 1.26.0
