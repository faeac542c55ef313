module github.com/meshagent/meshagent/pkg/trustbundle

go 1.26.0

require (
	github.com/meshagent/meshagent/pkg/events v0.0.0
	github.com/meshagent/meshagent/pkg/pki v0.0.0
	github.com/meshagent/meshagent/pkg/testkit v0.0.0
	github.com/nats-io/nats.go v1.55.0
)

require (
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/spiffe/go-spiffe/v2 v2.9.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

replace (
	github.com/meshagent/meshagent/pkg/events => ../events
	github.com/meshagent/meshagent/pkg/pki => ../pki
	github.com/meshagent/meshagent/pkg/testkit => ../testkit
)
