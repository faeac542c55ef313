module github.com/meshagent/meshagent/services/sds-edge

go 1.26.0
