package secrets

import (
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/tests/testkit"
)

func TestSPIFFEValidationKeepsDomainsApart(t *testing.T) {
	east := testkit.NewCA(t, "east", nil, time.Now(), time.Hour)
	west := testkit.NewCA(t, "west", nil, time.Now(), time.Hour)
	sec, err := SPIFFEValidation(map[string][]byte{"west.example": []byte(west.PEM()), "east.example": []byte(east.PEM())})
	if err != nil {
		t.Fatal(err)
	}
	// Read as Envoy reads it, with the generated types.
	var envoySec tlsv3.Secret
	if err := proto.Unmarshal(sec.AppendWire(nil), &envoySec); err != nil {
		t.Fatal(err)
	}
	if err := envoySec.ValidateAll(); err != nil || envoySec.GetName() != SPIFFERootCA {
		t.Fatalf("secret %q: envoy's own validation: %v", envoySec.GetName(), err)
	}
	cv := envoySec.GetValidationContext().GetCustomValidatorConfig()
	if cv.GetName() != SPIFFEValidatorName {
		t.Fatalf("validator = %q", cv.GetName())
	}
	var cfg tlsv3.SPIFFECertValidatorConfig
	if err := cv.GetTypedConfig().UnmarshalTo(&cfg); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("envoy's own validation: %v", err)
	}
	tds := cfg.GetTrustDomains()
	if len(tds) != 2 || tds[0].GetName() != "east.example" || string(tds[0].GetTrustBundle().GetInlineBytes()) != east.PEM() ||
		tds[1].GetName() != "west.example" || string(tds[1].GetTrustBundle().GetInlineBytes()) != west.PEM() {
		t.Fatalf("trust domains = %v", tds)
	}
	s := New(nil)
	if err := s.Check(SPIFFERootCA); err != nil {
		t.Fatal(err)
	}
	w := s.NewWatch()
	defer w.Close()
	w.Set([]string{SPIFFERootCA})
	if _, n := s.Set(sec); n != 1 {
		t.Fatalf("Set: woke %d", n)
	}
	if _, n := s.Set(sec); n != 0 {
		t.Fatal("an identical secret woke a watch")
	}
	for _, bad := range []map[string][]byte{nil, {"BAD DOMAIN": []byte(east.PEM())}, {"east.example": []byte("not pem")}} {
		if _, err := SPIFFEValidation(bad); err == nil {
			t.Fatalf("SPIFFEValidation(%v) accepted", bad)
		}
	}
}

func TestAliasesTakeTheHomeRoots(t *testing.T) {
	home := testkit.NewCA(t, "home", nil, time.Now(), time.Hour)
	west := testkit.NewCA(t, "west", nil, time.Now(), time.Hour)
	b := WithAliases(map[string][]byte{"cluster.local": []byte(home.PEM()), "west.example": []byte(west.PEM())},
		"cluster.local", []string{"old.local", "west.example"})
	if string(b["old.local"]) != home.PEM() {
		t.Fatal("alias lacks the home roots")
	}
	if string(b["west.example"]) != west.PEM() {
		t.Fatal("an alias overrode a foreign domain's roots")
	}
	if _, err := SPIFFEValidation(b); err != nil {
		t.Fatal(err)
	}
}
