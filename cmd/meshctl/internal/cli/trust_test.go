package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/pki"
	"github.com/meshagent/meshagent/tests/testkit"
)

func TestTrustRowsKeepDomainsApart(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	pem := "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	rows := trustRows(events.BundleReply{TrustDomain: "cluster.local", Roots: []string{pem, pem}, Generation: 4}, []events.TrustFederated{
		{TrustDomain: "cluster.local", Foreign: "west.example", Roots: []string{pem}, Source: "https://west/b", Sequence: 3,
			FetchedAt: now.Add(-time.Minute), RefreshHint: 5 * time.Minute},
		{TrustDomain: "cluster.local", Foreign: "old.example", Removed: true, Source: "https://old/b"},
	}, nil)
	if len(rows) != 3 || rows[0].Kind != "home" || rows[1].TrustDomain != "old.example" || rows[1].Kind != "removed" ||
		rows[2].Kind != "federated" || !rows[2].NextRefresh.Equal(now.Add(4*time.Minute)) {
		t.Fatalf("rows = %+v", rows)
	}
	var b strings.Builder
	printTrust(&b, rows, now)
	for _, want := range []string{"cluster.local  home       -", "west.example   federated  -      1", "https://west/b", "in 4m"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// The signer's endorsed status adds what the stream cannot say: a domain never
// fetched (listed, with its error), a failing one (its last good roots kept,
// its error shown), the roots one by one. A status whose endorsement does not
// verify under the reply's roots is left out, whatever it claims.
func TestTrustShowsFollowedDomainsState(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	ca := testkit.NewCA(t, "root", nil, now, time.Hour)
	rootPEM := string(pki.EncodeCertPEM(ca.Cert))
	st := events.FederationStatus{Signer: "s1", At: now, Domains: []events.FederatedDomain{
		{TrustDomain: "big.example", Source: "https://big/b", State: events.FederationNever, NextRefresh: now.Add(10 * time.Second),
			Error: "fetched but not announced: too large", ErrorReason: "announce", LastError: "fetched but not announced: too large",
			LastErrorReason: "announce", LastErrorAt: now.Add(-time.Second), Errors: map[string]uint64{"announce": 7}},
		{TrustDomain: "west.example", Source: "https://west/b", State: events.FederationFailing, Roots: 1, Sequence: 3,
			LastSuccess: now.Add(-time.Minute), NextRefresh: now.Add(10 * time.Second), RefreshHint: 5 * time.Minute,
			RootInfo: []events.FederatedRoot{{SHA256: strings.Repeat("ab", 32), Subject: "CN=west root", NotAfter: now.Add(48 * time.Hour)}},
			Error:    "GET https://west/b: redirect refused", ErrorReason: "redirect", LastErrorAt: now.Add(-2 * time.Second),
			Errors: map[string]uint64{"redirect": 2}},
	}}
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	endorse := func(raw []byte) []events.Endorsement {
		msg, err := events.FederationStatusEndorsedBytes("cluster.local", raw)
		if err != nil {
			t.Fatal(err)
		}
		id, sig, err := pki.Endorse(ca.Key, msg)
		if err != nil {
			t.Fatal(err)
		}
		return []events.Endorsement{{KeyID: id, Signature: sig}}
	}
	home := events.BundleReply{TrustDomain: "cluster.local", Roots: []string{rootPEM}, Generation: 1, Federation: raw, FederationEndorsements: endorse(raw)}
	got, err := federationStatus(home)
	if err != nil || got == nil || len(got.Domains) != 2 {
		t.Fatalf("federationStatus = %+v, %v", got, err)
	}
	feds := []events.TrustFederated{{TrustDomain: "cluster.local", Foreign: "west.example", Roots: []string{rootPEM}, Source: "https://west/b",
		Sequence: 3, FetchedAt: now.Add(-time.Minute), RefreshHint: 5 * time.Minute}}
	rows := trustRows(home, feds, got)
	if len(rows) != 3 || rows[1].TrustDomain != "big.example" || rows[1].State != "never" || rows[1].Roots != 0 || rows[1].ErrorReason != "announce" ||
		rows[2].State != "failing" || rows[2].Roots != 1 || !rows[2].NextRefresh.Equal(now.Add(10*time.Second)) || len(rows[2].RootInfo) != 1 {
		t.Fatalf("rows = %+v", rows)
	}
	var b strings.Builder
	printTrust(&b, rows, now)
	for _, want := range []string{
		"big.example    federated  never", "west.example   federated  failing  1",
		"big.example never fetched (signer s1, 7 failed refreshes, last 1s ago): announce: fetched but not announced: too large",
		"west.example failing", "redirect: GET https://west/b: redirect refused",
		"west.example root sha256:" + strings.Repeat("ab", 32) + " CN=west root, expires 2026-11-25T12:00:00Z (in 2d)",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}

	// Tampered (a domain dropped from the list) or endorsed by another key: left out.
	tampered, _ := json.Marshal(events.FederationStatus{Signer: "s1", At: now, Domains: st.Domains[1:]})
	other := testkit.NewCA(t, "other", nil, now, time.Hour)
	msg, _ := events.FederationStatusEndorsedBytes("cluster.local", raw)
	id, sig, _ := pki.Endorse(other.Key, msg)
	for name, r := range map[string]events.BundleReply{
		"tampered":     {TrustDomain: "cluster.local", Roots: []string{rootPEM}, Federation: tampered, FederationEndorsements: endorse(raw)},
		"another key":  {TrustDomain: "cluster.local", Roots: []string{rootPEM}, Federation: raw, FederationEndorsements: []events.Endorsement{{KeyID: id, Signature: sig}}},
		"not endorsed": {TrustDomain: "cluster.local", Roots: []string{rootPEM}, Federation: raw},
		"other domain": {TrustDomain: "evil.example", Roots: []string{rootPEM}, Federation: raw, FederationEndorsements: endorse(raw)},
	} {
		if got, err := federationStatus(r); err == nil || got != nil {
			t.Errorf("%s: status taken: %+v", name, got)
		}
	}
}
