module github.com/meshagent/meshagent/deploy/compose

go 1.26.0

require (
	github.com/meshagent/meshagent/pkg/events v0.0.0
	github.com/meshagent/meshagent/pkg/faultcheck v0.0.0
	github.com/meshagent/meshagent/pkg/pki v0.0.0
	github.com/meshagent/meshagent/pkg/testkit v0.0.0
	github.com/nats-io/nats.go v1.55.0
)

require (
	github.com/fatih/color v1.13.0 // indirect
	github.com/hashicorp/go-hclog v1.6.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/mattn/go-colorable v0.1.12 // indirect
	github.com/mattn/go-isatty v0.0.14 // indirect
	github.com/meshagent/meshagent/pkg/sdsclient v0.0.0 // indirect
	github.com/meshagent/meshagent/pkg/xdswire v0.0.0 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/spiffe/go-spiffe/v2 v2.9.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/grpc v1.85.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace (
	github.com/meshagent/meshagent/pkg/bus => ../../pkg/bus
	github.com/meshagent/meshagent/pkg/events => ../../pkg/events
	github.com/meshagent/meshagent/pkg/faultcheck => ../../pkg/faultcheck
	github.com/meshagent/meshagent/pkg/flagenv => ../../pkg/flagenv
	github.com/meshagent/meshagent/pkg/pki => ../../pkg/pki
	github.com/meshagent/meshagent/pkg/sdsclient => ../../pkg/sdsclient
	github.com/meshagent/meshagent/pkg/testkit => ../../pkg/testkit
	github.com/meshagent/meshagent/pkg/xdswire => ../../pkg/xdswire
)
