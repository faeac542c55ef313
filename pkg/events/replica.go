package events

import (
	"fmt"
	"strings"
)

// Reaching one signer replica. A request in the signer queue group goes where the
// bus puts it: nats-server picks a queue member at random, so while a replica is
// frozen (a paused VM, a stopped process) it keeps its share of the requests, which
// wait on it until its node drops the connection for missed pings. A requester whose request timed out in the queue group asks who answers
// now (SubjectSignerPing, no queue group: every live replica replies with a
// SignerPong) and sends the request again straight to one that did, on that
// replica's sign subject:
//
//	meshagent.rpc.signer.<replica>.sign.<the rest of the sign subject>
//
// The replica sign subject carries the sign subject whole, so the bus permission
// that lets a pod publish on its own sign subject lets it publish the replica form
// of that one subject and no other (ReplicaSignPattern, pkg/bus/policy), and the
// signer reads the pod and identity from it as from the sign subject itself.
const (
	// SubjectSignerPing asks every live signer replica for its name.
	SubjectSignerPing = Prefix + ".rpc.signer.ping"
	// replicaPrefix starts every replica sign subject.
	replicaPrefix = Prefix + ".rpc.signer."
	// signSuffixFrom is the part of a sign subject the replica form keeps.
	signSuffixFrom = Prefix + ".rpc."
)

// Type names of the replica ping.
const (
	TypeSignerPing = "io.meshagent.signer.ping.v1"
	TypeSignerPong = "io.meshagent.signer.pong.v1"
)

func init() {
	register[SignerPing]()
	register[SignerPong]()
}

// SignerPing asks every live signer replica to say its name.
type SignerPing struct{}

func (SignerPing) EventType() string { return TypeSignerPing }
func (SignerPing) Validate() error   { return nil }

// SignerPong answers a SignerPing: the replica's name, as its replica sign
// subjects carry it.
type SignerPong struct {
	Replica string `json:"replica"`
}

func (SignerPong) EventType() string { return TypeSignerPong }
func (p SignerPong) Validate() error {
	if err := ValidateIdentityToken(p.Replica); err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	return nil
}

// ReplicaSignSubject is signSubject (a sign subject: SignWildcard matches it) sent
// straight to the signer replica named replica.
func ReplicaSignSubject(replica, signSubject string) (string, error) {
	if err := ValidateIdentityToken(replica); err != nil {
		return "", fmt.Errorf("signer replica: %w", err)
	}
	rest, ok := strings.CutPrefix(signSubject, signSuffixFrom)
	if !ok || !strings.HasPrefix(rest, "sign.") {
		return "", fmt.Errorf("%q is not a sign subject", signSubject)
	}
	return replicaPrefix + replica + "." + rest, nil
}

// ReplicaSignPattern matches signSubject sent to any replica: a bus permission.
func ReplicaSignPattern(signSubject string) string {
	return replicaPrefix + "*." + strings.TrimPrefix(signSubject, signSuffixFrom)
}

// ReplicaSignWildcard is what the replica named replica subscribes to.
func ReplicaSignWildcard(replica string) string { return replicaPrefix + replica + ".sign.>" }

// SignerReplicaWildcard matches every replica subject, the ping included: the
// signers' subscribe permission.
const SignerReplicaWildcard = Prefix + ".rpc.signer.>"

// SignSubjectOfReplica is ReplicaSignSubject's inverse: the sign subject and
// replica a replica sign subject names, and false for any other subject.
func SignSubjectOfReplica(subject string) (signSubject, replica string, ok bool) {
	rest, found := strings.CutPrefix(subject, replicaPrefix)
	if !found {
		return "", "", false
	}
	replica, rest, found = strings.Cut(rest, ".")
	if !found || !strings.HasPrefix(rest, "sign.") || ValidateIdentityToken(replica) != nil {
		return "", "", false
	}
	return signSuffixFrom + rest, replica, true
}
