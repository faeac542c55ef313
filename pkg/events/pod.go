package events

import (
	"fmt"
	"strings"
)

// DefaultNamespace is the namespace a bare pod name means where a person types one
// (ParsePodRef): Kubernetes' own default.
const DefaultNamespace = "default"

// BenchNamespace is the namespace of meshctl bench's load: its tokens, pods and
// certificates. Readers keep it out of fleet counts and live prints by default, so
// that a benchmark leaves the operator's view as it found it.
const BenchNamespace = "meshagent-bench"

// NamespaceOfID is the namespace of a SPIFFE ID of the form
// spiffe://<td>/ns/<ns>/sa/<sa>, "" for any other.
func NamespaceOfID(id string) string {
	rest, ok := strings.CutPrefix(id, "spiffe://")
	if !ok {
		return ""
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 5 || parts[1] != "ns" || parts[3] != "sa" {
		return ""
	}
	return parts[2]
}

// PodRef names one pod: its namespace and its name. A pod on the bus is always both
// (docs/security.md): pod names repeat across namespaces (web-0, redis-0), so a name
// alone would let a pod of one namespace be another namespace's pod of that name.
//
// It travels as one string, "<namespace>/<name>" (MarshalText), in every payload;
// in subjects as two tokens, "<namespace>.<name>" (the name's '.' as '~').
type PodRef struct {
	Namespace string
	Name      string
}

// String is "<namespace>/<name>", "" for the zero PodRef.
func (p PodRef) String() string {
	if p.IsZero() {
		return ""
	}
	return p.Namespace + "/" + p.Name
}

// IsZero reports whether p names no pod.
func (p PodRef) IsZero() bool { return p == PodRef{} }

// Validate reports whether p can name a pod on the bus: the namespace a DNS label
// (as Kubernetes requires of namespaces), the name as ValidatePodID.
func (p PodRef) Validate() error {
	if err := ValidateNamespace(p.Namespace); err != nil {
		return fmt.Errorf("pod %q: %w", p.String(), err)
	}
	if err := ValidatePodID(p.Name); err != nil {
		return fmt.Errorf("pod %q: %w", p.String(), err)
	}
	return nil
}

// MarshalText writes "<namespace>/<name>" (empty for the zero PodRef); it does not
// validate: a payload's Validate does.
func (p PodRef) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText reads "<namespace>/<name>" as written by MarshalText. A bare name is
// read as a PodRef without a namespace, which Validate then refuses: on the wire
// there is one encoding, and no default.
func (p *PodRef) UnmarshalText(b []byte) error {
	ns, name, ok := strings.Cut(string(b), "/")
	if !ok {
		*p = PodRef{Name: string(b)}
		return nil
	}
	*p = PodRef{Namespace: ns, Name: name}
	return nil
}

// ParsePodRef reads a pod as a person writes one: "<namespace>/<name>", or a bare
// name meaning DefaultNamespace. The result is validated.
func ParsePodRef(s string) (PodRef, error) {
	var p PodRef
	if ns, name, ok := strings.Cut(s, "/"); ok {
		p = PodRef{Namespace: ns, Name: name}
	} else {
		p = PodRef{Namespace: DefaultNamespace, Name: s}
	}
	if err := p.Validate(); err != nil {
		return PodRef{}, err
	}
	return p, nil
}

// PodRefFromString reads what String wrote, "<namespace>/<name>", strictly: a bare
// name is an error here (a key or a record written by meshagent always has both).
func PodRefFromString(s string) (PodRef, error) {
	var p PodRef
	_ = p.UnmarshalText([]byte(s))
	if err := p.Validate(); err != nil {
		return PodRef{}, err
	}
	return p, nil
}

// ValidateNamespace reports whether ns is a Kubernetes namespace name: a DNS label,
// 1-63 of [a-z0-9-], starting and ending alphanumeric. Such a name is always one
// subject token as it is.
func ValidateNamespace(ns string) error {
	ok := len(ns) >= 1 && len(ns) <= 63 && isLowerAlnum(ns[0]) && isLowerAlnum(ns[len(ns)-1])
	for i := 0; ok && i < len(ns); i++ {
		ok = isLowerAlnum(ns[i]) || ns[i] == '-'
	}
	if !ok {
		return fmt.Errorf("invalid namespace %q: want a DNS label, 1-63 of [a-z0-9-], starting and ending alphanumeric", ns)
	}
	return nil
}

func isLowerAlnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

// tokens is p as two subject tokens, "<namespace>.<name>"; p must be valid.
func (p PodRef) tokens() string { return p.Namespace + "." + podToken(p.Name) }

// podFromTokens reads the two tokens tokens wrote, false unless they name a valid pod.
func podFromTokens(ns, name string) (PodRef, bool) {
	p := PodRef{Namespace: ns, Name: strings.ReplaceAll(name, "~", ".")}
	if p.Validate() != nil {
		return PodRef{}, false
	}
	return p, true
}
