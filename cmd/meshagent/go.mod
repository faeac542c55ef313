module github.com/meshagent/meshagent/cmd/meshagent

go 1.26.0

require (
	cel.dev/expr v0.25.3
	github.com/beorn7/perks v1.0.1
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/cncf/xds/go v0.0.0-20260202195803-dba9d589def2
	github.com/envoyproxy/go-control-plane/envoy v1.40.0
	github.com/envoyproxy/protoc-gen-validate v1.3.3
	github.com/fatih/color v1.13.0
	github.com/fsnotify/fsnotify v1.10.1
	github.com/golang/protobuf v1.5.4
	github.com/hashicorp/go-hclog v1.6.3
	github.com/klauspost/compress v1.20.3
	github.com/mattn/go-colorable v0.1.12
	github.com/mattn/go-isatty v0.0.14
	github.com/meshagent/meshagent/pkg/flagenv v0.0.0
	github.com/meshagent/meshagent/pkg/lifecycle v0.0.0
	github.com/meshagent/meshagent/services/launcher v0.0.0
	github.com/meshagent/meshagent/services/sds-edge v0.0.0
	github.com/meshagent/meshagent/services/xds-relay v0.0.0
	github.com/miekg/dns v1.1.73
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822
	github.com/nats-io/jwt/v2 v2.8.2
	github.com/nats-io/nats.go v1.55.0
	github.com/nats-io/nkeys v0.4.16
	github.com/nats-io/nuid v1.0.1
	github.com/prometheus/client_golang v1.25.0
	github.com/prometheus/client_model v0.6.3
	github.com/prometheus/common v0.72.0
	github.com/prometheus/procfs v0.22.0
	github.com/spiffe/go-spiffe/v2 v2.9.0
	golang.org/x/crypto v0.58.0
	golang.org/x/net v0.60.0
	golang.org/x/sys v0.49.0
	golang.org/x/text v0.43.0
	google.golang.org/genproto/googleapis/api v0.0.0-20260817212433-ac3dfec99bb1
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
	istio.io/api v1.31.1
)

require (
	github.com/meshagent/meshagent/pkg/atomicfile v0.0.0 // indirect
	github.com/meshagent/meshagent/pkg/bus v0.0.0 // indirect
	github.com/meshagent/meshagent/pkg/clock v0.0.0 // indirect
	github.com/meshagent/meshagent/pkg/events v0.0.0 // indirect
	github.com/meshagent/meshagent/pkg/nds v0.0.0 // indirect
	github.com/meshagent/meshagent/pkg/obs v0.0.0 // indirect
	github.com/meshagent/meshagent/pkg/outbox v0.0.0 // indirect
	github.com/meshagent/meshagent/pkg/pki v0.0.0 // indirect
	github.com/meshagent/meshagent/pkg/sdsclient v0.0.0 // indirect
	github.com/meshagent/meshagent/pkg/trustbundle v0.0.0 // indirect
	github.com/meshagent/meshagent/pkg/udsock v0.0.0 // indirect
	github.com/meshagent/meshagent/pkg/xdswire v0.0.0 // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20240319094008-0393e58bdf10 // indirect
)

replace (
	github.com/meshagent/meshagent/pkg/atomicfile => ../../pkg/atomicfile
	github.com/meshagent/meshagent/pkg/bus => ../../pkg/bus
	github.com/meshagent/meshagent/pkg/clock => ../../pkg/clock
	github.com/meshagent/meshagent/pkg/devtoken => ../../pkg/devtoken
	github.com/meshagent/meshagent/pkg/events => ../../pkg/events
	github.com/meshagent/meshagent/pkg/flagenv => ../../pkg/flagenv
	github.com/meshagent/meshagent/pkg/lifecycle => ../../pkg/lifecycle
	github.com/meshagent/meshagent/pkg/nds => ../../pkg/nds
	github.com/meshagent/meshagent/pkg/obs => ../../pkg/obs
	github.com/meshagent/meshagent/pkg/outbox => ../../pkg/outbox
	github.com/meshagent/meshagent/pkg/pki => ../../pkg/pki
	github.com/meshagent/meshagent/pkg/sdsclient => ../../pkg/sdsclient
	github.com/meshagent/meshagent/pkg/testkit => ../../pkg/testkit
	github.com/meshagent/meshagent/pkg/trustbundle => ../../pkg/trustbundle
	github.com/meshagent/meshagent/pkg/udsock => ../../pkg/udsock
	github.com/meshagent/meshagent/pkg/xdswire => ../../pkg/xdswire
	github.com/meshagent/meshagent/services/launcher => ../../services/launcher
	github.com/meshagent/meshagent/services/sds-edge => ../../services/sds-edge
	github.com/meshagent/meshagent/services/xds-relay => ../../services/xds-relay
)
