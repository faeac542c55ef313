// Package faults holds the NATS-cluster faults of docs/reliability.md without Docker,
// part of `make test`: three embedded nats-servers clustered over loopback ports with
// JetStream (the event stream and the CA bucket R3), the real signer, rotator and
// sds-edge binaries on it, and the stream leader, the meta leader and a follower
// killed in turn while the pod is watched at its SDS socket (tests/faultcheck). The
// docker compose suite (deploy/compose, make test-compose) covers the rest.
package faults
