module github.com/meshagent/meshagent/pkg/nds

go 1.26.0

require google.golang.org/protobuf v1.36.12
