package policy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nkeys"
)

// Validate checks that k names a user key for every role in Users and an account key
// for the issuer.
func (k Keys) Validate() error {
	var errs []error
	for _, r := range Users {
		if !nkeys.IsValidPublicUserKey(k.Users[r]) {
			errs = append(errs, fmt.Errorf("role %s: %q is not a user nkey", r, k.Users[r]))
		}
	}
	if !nkeys.IsValidPublicAccountKey(k.Issuer) {
		errs = append(errs, fmt.Errorf("callout issuer: %q is not an account nkey", k.Issuer))
	}
	return errors.Join(errs...)
}

// Render writes the nats-server configuration of the role table for keys k: the
// accounts (MESHAGENT with JetStream, AUTH for the callout), each role's user and
// permissions, and the auth callout that admits pods. Include it in a fleet's server
// configuration; the embedded server parses the very same text.
func Render(k Keys) (string, error) {
	if err := k.Validate(); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("# meshagent bus authorization, rendered from pkg/bus/policy (see docs/security.md).\n")
	b.WriteString("# Deny by default: each user may publish and subscribe only what its role allows.\n")
	fmt.Fprintf(&b, "accounts {\n  %s {\n    jetstream: enabled\n    users: [\n", AccountMesh)
	for _, r := range Users {
		if r != Callout {
			if err := renderUser(&b, r, k.Users[r]); err != nil {
				return "", err
			}
		}
	}
	fmt.Fprintf(&b, "    ]\n  }\n  %s {\n    users: [\n", AccountAuth)
	if err := renderUser(&b, Callout, k.Users[Callout]); err != nil {
		return "", err
	}
	b.WriteString("    ]\n  }\n}\n")
	auth := make([]string, 0, len(Users))
	for _, r := range Users {
		auth = append(auth, k.Users[r])
	}
	fmt.Fprintf(&b, "authorization {\n  # Every other client is a pod: the callout checks its service-account token.\n")
	fmt.Fprintf(&b, "  # How long the server waits for a client's credential and for the callout's answer:\n")
	fmt.Fprintf(&b, "  # below the clients' connect timeout, so that nothing is admitted for a client that has gone.\n")
	fmt.Fprintf(&b, "  timeout: %g\n", AuthTimeout.Seconds())
	fmt.Fprintf(&b, "  auth_callout {\n    issuer: %s\n    account: %s\n    auth_users: %s\n  }\n}\n",
		strconv.Quote(k.Issuer), AccountAuth, list(auth))
	return b.String(), nil
}

func renderUser(b *strings.Builder, r Role, nkey string) error {
	p, err := For(r)
	if err != nil {
		return err
	}
	fmt.Fprintf(b, "      # %s\n      { nkey: %s, permissions: {\n", r, strconv.Quote(nkey))
	if len(p.Publish) == 0 {
		b.WriteString("        publish: { deny: [\">\"] }\n")
	} else {
		fmt.Fprintf(b, "        publish: { allow: %s }\n", list(p.Publish))
	}
	fmt.Fprintf(b, "        subscribe: { allow: %s }\n", list(p.Subscribe))
	if p.Responses {
		b.WriteString("        allow_responses: true\n")
	}
	b.WriteString("      } }\n")
	return nil
}

func list(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}
