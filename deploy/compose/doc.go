// Package compose holds the docker compose deployment of meshagent and, behind the
// "compose" build tag (make test-compose), the suite that runs it: a 3-node NATS
// cluster, two signers, two rotators and a demo pod as containers, checked for
// renewals that survive the loss of a NATS node and of a signer.
package compose
