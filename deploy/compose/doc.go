// Package compose holds the docker compose deployment of meshagent and, behind the
// "compose" build tag (make test-compose), its fault suite: the stack of compose.yaml
// (a 3-node NATS cluster with TLS and mutual-TLS routes, two signers, two rotators,
// the operator service and a demo pod as containers, each holding only its own
// credential) under its own project name and free host ports, put through the
// faults of docs/reliability.md —
// a signer, both signers, the leading rotator, the NATS stream and meta leaders, the
// pod cut off the bus, a root rotation, a restart and a stop and start; gray ones: a
// signer, the stream leader's NATS node and sds-edge paused, a node's JetStream store
// full — each checked
// at the pod's SDS socket (what it serves, its expiry, /readyz), in the event stream
// (nothing lost) and for the time to heal; the refusals of the secured bus; and
// meshctl's proxy-status, describe, check and bug-report against the cluster.
package compose
