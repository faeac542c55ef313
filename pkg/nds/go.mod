module github.com/meshagent/meshagent/pkg/nds

go 1.26.0

require (
	github.com/meshagent/meshagent/pkg/xdswire v0.0.0
	google.golang.org/protobuf v1.36.12
)

require (
	golang.org/x/sys v0.48.0 // indirect
	google.golang.org/grpc v1.85.0 // indirect
)

replace github.com/meshagent/meshagent/pkg/xdswire => ../xdswire
