package federation

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
)

// maxStatusBytes bounds the federation status in a bundle reply (itself
// bounded by events.MaxEventSize with the home roots beside it).
const maxStatusBytes = 32 << 10

// maxRootInfo is how many roots of one domain the status lists one by one (the
// count is always there).
const maxRootInfo = 8

// Status is the followed foreign domains' state as a bundle reply carries it
// (natsapi.FederationStatusFunc): JSON endorsed by the current CA key, so that
// meshctl can tell it comes from the CA's holder. A domain that never worked is
// listed with its error.
func (s *Service) Status() (json.RawMessage, []events.Endorsement, error) {
	m := s.auth.Current()
	if m == nil {
		return nil, nil, errors.New("CA not loaded yet")
	}
	st := events.FederationStatus{Signer: s.cfg.Instance, At: s.clk.Now().UTC(), Domains: []events.FederatedDomain{}}
	for _, d := range s.Followed() {
		st.Domains = append(st.Domains, domainStatus(d))
	}
	raw, err := json.Marshal(st)
	if err != nil {
		return nil, nil, err
	}
	// Over the bound: drop the per-root details, then whole domains (counted).
	if len(raw) > maxStatusBytes {
		for i := range st.Domains {
			st.Domains[i].RootInfo = nil
		}
		for raw, err = json.Marshal(st); err == nil && len(raw) > maxStatusBytes && len(st.Domains) > 0; raw, err = json.Marshal(st) {
			st.Domains, st.Truncated = st.Domains[:len(st.Domains)-1], st.Truncated+1
		}
		if err != nil {
			return nil, nil, err
		}
	}
	msg, err := events.FederationStatusEndorsedBytes(s.cfg.TrustDomain, raw)
	if err != nil {
		return nil, nil, err
	}
	id, sig, err := pki.Endorse(m.Key, msg)
	if err != nil {
		return nil, nil, fmt.Errorf("endorse federation status: %w", err)
	}
	e := events.Endorsement{KeyID: id, Signature: sig}
	if len(m.Chain) > 1 {
		e.Chain = m.IntermediatePEMs()
	}
	return raw, []events.Endorsement{e}, nil
}

// domainStatus is one domain's follower status in wire form.
func domainStatus(s Status) events.FederatedDomain {
	d := events.FederatedDomain{TrustDomain: s.TrustDomain, Source: s.Where, Roots: s.Roots, Sequence: s.Sequence,
		RefreshHint: s.RefreshHint, LastSuccess: utc(s.FetchedAt), NextRefresh: utc(s.NextRefresh),
		Error: s.Err, ErrorReason: s.ErrReason, LastError: s.LastErr, LastErrorReason: s.LastErrReason,
		LastErrorAt: utc(s.LastErrAt), Errors: s.Errors}
	switch {
	case s.FetchedAt.IsZero():
		d.State = events.FederationNever
	case s.Err != "":
		d.State = events.FederationFailing
	default:
		d.State = events.FederationOK
	}
	for i, r := range s.RootInfo {
		if i == maxRootInfo {
			break
		}
		d.RootInfo = append(d.RootInfo, events.FederatedRoot{SHA256: r.SHA256, Subject: r.Subject, NotAfter: utc(r.NotAfter)})
	}
	return d
}

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}
