module github.com/meshagent/meshagent/services/xds-relay

go 1.26.0
