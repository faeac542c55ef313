package nds

import (
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func TestRoundTrip(t *testing.T) {
	in := Table{
		"reviews.default.svc.cluster.local": {IPs: []string{"10.96.0.20", "fd00::20"}, Registry: "Kubernetes",
			Shortname: "reviews", Namespace: "default"},
		"api.example.com": {IPs: []string{"240.240.0.1"}, Registry: "External", AltHosts: []string{"api.example.org"}},
	}
	out, err := Unmarshal(Marshal(in))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip:\n got %#v\nwant %#v", out, in)
	}
}

func TestMessageMarshalsToTheWireForm(t *testing.T) {
	in := Table{"a.b": {IPs: []string{"1.2.3.4"}, Registry: "Kubernetes"}}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(Message(in))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := Unmarshal(b); err != nil || !reflect.DeepEqual(in, out) {
		t.Fatalf("got %#v (%v)", out, err)
	}
}

func TestUnknownFieldsSkipped(t *testing.T) {
	b := Marshal(Table{"a.b": {IPs: []string{"1.2.3.4"}}})
	b = protowire.AppendTag(b, 9, protowire.VarintType)
	b = protowire.AppendVarint(b, 7)
	got, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if got["a.b"].IPs[0] != "1.2.3.4" {
		t.Fatalf("got %#v", got)
	}
}

func TestMalformed(t *testing.T) {
	for name, b := range map[string][]byte{
		"truncated": Marshal(Table{"a.b": {IPs: []string{"1.2.3.4"}}})[:5],
		"bad tag":   {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"not entry": protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 3),
	} {
		if _, err := Unmarshal(b); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
