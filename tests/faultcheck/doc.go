// Package faultcheck is what the fault suites (deploy/compose's, behind the compose
// build tag, and tests/faults' embedded NATS cluster) watch while they break a stack:
// a pod as its Envoy sees it (one SDS stream on its socket, plus /readyz), the event
// history as the bus carried it and as the JetStream stream holds it, and the
// figures drawn from both — time to heal, an expired certificate served, readiness.
// docs/reliability.md says what each suite checks with it.
package faultcheck
