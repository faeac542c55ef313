// Package compose holds the docker compose deployment of meshagent and, behind the
// "compose" build tag (make test-compose), the suite that runs it: a 3-node NATS
// cluster with TLS and mutual-TLS routes, two signers, two rotators and a demo pod as
// containers, each holding only its own credential (made by meshctl compose-secrets),
// checked for renewals that survive the loss of a NATS node and of a signer, and for
// the refusals of the secured bus.
package compose
