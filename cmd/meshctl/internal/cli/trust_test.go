package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/events"
)

func TestTrustRowsKeepDomainsApart(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	pem := "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	rows := trustRows(events.BundleReply{TrustDomain: "cluster.local", Roots: []string{pem, pem}, Generation: 4}, []events.TrustFederated{
		{TrustDomain: "cluster.local", Foreign: "west.example", Roots: []string{pem}, Source: "https://west/b", Sequence: 3,
			FetchedAt: now.Add(-time.Minute), RefreshHint: 5 * time.Minute},
		{TrustDomain: "cluster.local", Foreign: "old.example", Removed: true, Source: "https://old/b"},
	})
	if len(rows) != 3 || rows[0].Kind != "home" || rows[1].TrustDomain != "old.example" || rows[1].Kind != "removed" ||
		rows[2].Kind != "federated" || !rows[2].NextRefresh.Equal(now.Add(4*time.Minute)) {
		t.Fatalf("rows = %+v", rows)
	}
	var b strings.Builder
	printTrust(&b, rows, now)
	for _, want := range []string{"cluster.local  home", "west.example   federated  1", "https://west/b", "in 4m"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
