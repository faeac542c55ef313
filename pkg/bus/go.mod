module github.com/meshagent/meshagent/pkg/bus

go 1.26.0

require (
	github.com/hashicorp/go-hclog v1.6.3
	github.com/meshagent/meshagent/pkg/events v0.0.0
	github.com/meshagent/meshagent/pkg/testkit v0.0.0
	github.com/nats-io/nats-server/v2 v2.15.2
	github.com/nats-io/nats.go v1.55.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect

require (
	github.com/antithesishq/antithesis-sdk-go v0.8.0-default-no-op // indirect
	github.com/fatih/color v1.13.0 // indirect
	github.com/google/go-tpm v0.9.8 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/mattn/go-colorable v0.1.12 // indirect
	github.com/mattn/go-isatty v0.0.14 // indirect
	github.com/meshagent/meshagent/pkg/flagenv v0.0.0
	github.com/minio/highwayhash v1.0.4 // indirect
	github.com/nats-io/jwt/v2 v2.8.2
	github.com/nats-io/nkeys v0.4.16
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/time v0.16.0 // indirect
)

replace github.com/meshagent/meshagent/pkg/events => ../events

replace github.com/meshagent/meshagent/pkg/flagenv => ../flagenv

replace github.com/meshagent/meshagent/pkg/testkit => ../testkit
