// Package events is meshagent's bus contract: every NATS subject, the CloudEvents 1.0
// envelope, and the typed, versioned payloads that services exchange. Nothing else
// lives here: no connections, no business logic.
//
// # Envelope
//
// Events use the CloudEvents NATS protocol binding in binary content mode: the
// attributes travel as NATS headers (ce-specversion, ce-id, ce-source, ce-type,
// ce-time, ce-subject) and the message body is the payload alone, as JSON
// (content-type application/json). A subscriber that only wants the payload reads
// the body; one that wants the envelope reads the headers. Binary mode keeps the
// body equal to the payload's JSON Schema (schemas/<type>.json), so a third-party
// subscriber can validate it without unwrapping anything.
//
// # Versioning
//
// The version is part of the type name (io.meshagent.cert.issued.v1). An optional new
// field keeps the version; a change of meaning makes a v2, published beside v1 until
// no consumer needs v1. Decoders reject unknown types and bodies over MaxEventSize,
// and ignore unknown fields.
//
// # Subjects
//
//	meshagent.evt.>                        events: the CA's (cert, trust, rotation) in the
//	                                       MESHAGENT_EVENTS stream, pods' (evt.pod.>) in
//	                                       MESHAGENT_POD_EVENTS
//	meshagent.pod.<ns>.<name>.renew        renew-due commands to one pod's sds-edge
//	meshagent.pod.<ns>.<name>.anchors      one pod's extra trust anchors, to itself
//	meshagent.rpc.sign.pod.<ns>.<name>     sign request/reply (queue group "signer")
//	meshagent.rpc.sign.id.<ns>.<sa>.<name> the same, for a pod the bus callout admitted
//	meshagent.rpc.signer.ping              which signer replicas answer now (no queue)
//	meshagent.rpc.signer.<replica>.sign.>  a sign subject sent to one replica by name
//	meshagent.rpc.trust.bundle             current trust bundle, request/reply
//	meshagent.rpc.root.rotate              force a root rotation, request/reply
//
// A pod is its namespace and its name (PodRef), never a bare name: the same name in
// another namespace is another pod.
//
// Requests carry bearer tokens and so live outside meshagent.evt.>: an audit
// subscriber on meshagent.evt.> never sees a credential, and no subject ever carries
// a private key.
package events
