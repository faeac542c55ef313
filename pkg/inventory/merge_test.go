package inventory

import (
	"encoding/json"
	"testing"
)

// TestMergeKeepsOneMinutePerSlot: counts of the stored minute grow; a record of an
// older minute in the slot (two hours ago) is replaced; a newer one is kept and the
// older counts dropped.
func TestMergeKeepsOneMinutePerSlot(t *testing.T) {
	read := func(b []byte) Window {
		var w Window
		if err := json.Unmarshal(b, &w); err != nil {
			t.Fatal(err)
		}
		return w
	}
	b, changed, err := merge(nil, Window{Minute: 500, Issued: map[string]int{"s": 1}})
	if err != nil || !changed {
		t.Fatal(changed, err)
	}
	b, _, _ = merge(b, Window{Minute: 500, Issued: map[string]int{"s": 2}, SDSNacks: 1})
	if w := read(b); w.Issued["s"] != 3 || w.SDSNacks != 1 {
		t.Fatalf("same minute: %+v", w)
	}
	b, _, _ = merge(b, Window{Minute: 500 + CounterSlots, Renewals: map[string]int{"retry": 1}})
	if w := read(b); w.Minute != 500+CounterSlots || w.Issued != nil || w.Renewals["retry"] != 1 {
		t.Fatalf("the ring came round: %+v", w)
	}
	if _, changed, _ := merge(b, Window{Minute: 500, XDSNacks: 1}); changed {
		t.Fatal("a count older than the slot's minute was stored")
	}
	if b, changed, _ := merge([]byte("garbage"), Window{Minute: 7, Bench: 1}); !changed || read(b).Bench != 1 {
		t.Fatal("a malformed record was not started again")
	}
}
