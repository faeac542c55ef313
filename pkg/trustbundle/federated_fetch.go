package trustbundle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/meshagent/meshagent/pkg/events"
)

// MaxFederatedDomains bounds how many foreign domains FetchFederated looks up.
const MaxFederatedDomains = 64

// FetchFederated returns the last trust.federated announcement of every foreign
// domain the signers follow, for a process that starts after they were announced
// (core NATS keeps nothing for late subscribers). It asks a signer which domains
// it follows (a BundleRequest with Federation), then reads each domain's last
// announcement from the CA's history by JetStream direct get
// (events.TrustFederatedLastSubject). Nothing here is verified: the caller checks
// each announcement as it checks one that arrives live (endorsed by its home CA).
// A domain without an announcement in the stream is left out.
func FetchFederated(ctx context.Context, nc *nats.Conn, source string) ([]events.TrustFederated, error) {
	msg, err := events.NewMsg(events.SubjectTrustBundle, source, events.BundleRequest{Federation: true})
	if err != nil {
		return nil, err
	}
	reply, err := nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("federation status request: %w", err)
	}
	r, _, err := events.Decode[events.BundleReply](reply)
	if err != nil {
		return nil, fmt.Errorf("federation status reply: %w", err)
	}
	if r.Error != nil {
		return nil, fmt.Errorf("federation status: %w", r.Error)
	}
	if len(r.Federation) == 0 {
		return nil, nil
	}
	var st events.FederationStatus
	if err := json.Unmarshal(r.Federation, &st); err != nil {
		return nil, fmt.Errorf("federation status: %w", err)
	}
	var out []events.TrustFederated
	var errs []error
	for i, d := range st.Domains {
		if i == MaxFederatedDomains {
			errs = append(errs, fmt.Errorf("%d foreign domains, only the first %d read", len(st.Domains), MaxFederatedDomains))
			break
		}
		if d.State == events.FederationNever {
			continue
		}
		ev, ok, err := lastFederated(ctx, nc, d.TrustDomain)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.TrustDomain, err))
			continue
		}
		if ok {
			out = append(out, ev)
		}
	}
	return out, errors.Join(errs...)
}

// lastFederated reads td's last trust.federated from the CA's history; ok is
// false when the stream holds none.
func lastFederated(ctx context.Context, nc *nats.Conn, td string) (events.TrustFederated, bool, error) {
	subj, err := events.TrustFederatedLastSubject(td)
	if err != nil {
		return events.TrustFederated{}, false, err
	}
	m, err := nc.RequestWithContext(ctx, subj, nil)
	if err != nil {
		return events.TrustFederated{}, false, fmt.Errorf("direct get: %w", err)
	}
	if st := m.Header.Get("Status"); st != "" {
		if st == "404" {
			return events.TrustFederated{}, false, nil
		}
		return events.TrustFederated{}, false, fmt.Errorf("direct get: status %s %s", st, m.Header.Get("Description"))
	}
	ev, _, err := events.Decode[events.TrustFederated](m)
	if err != nil {
		return events.TrustFederated{}, false, err
	}
	if ev.Foreign != td {
		return events.TrustFederated{}, false, fmt.Errorf("announcement for %q on %q's subject", ev.Foreign, td)
	}
	return ev, true, nil
}
