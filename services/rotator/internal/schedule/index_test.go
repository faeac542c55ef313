package schedule

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestRandomOpsMatchAMap drives the schedule with random inserts, replacements,
// removals and retirements and checks it against a plain map after every step.
func TestRandomOpsMatchAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	s := New(cfg())
	ref := map[string]string{} // pod/resource -> serial
	serial := 0
	for step := range 20000 {
		pod := fmt.Sprintf("p-%d", rng.IntN(500))
		res := []string{"default", "default", "file-cert"}[rng.IntN(3)]
		k := pod + "/" + res
		switch op := rng.IntN(10); {
		case op < 6:
			serial++
			c := Cert{Pod: pod, Resource: res, Serial: fmt.Sprint(serial), Root: "r",
				NotBefore: t0.Add(time.Duration(serial) * time.Second), NotAfter: t0.Add(time.Duration(serial)*time.Second + time.Hour)}
			if _, err := s.Upsert(c, t0); err != nil {
				t.Fatal(err)
			}
			ref[k] = c.Serial
		case op < 8:
			s.Remove(pod, res)
			delete(ref, k)
		default:
			s.RetirePod(pod)
			delete(ref, pod+"/default")
			delete(ref, pod+"/file-cert")
		}
		if s.Len() != len(ref) {
			t.Fatalf("step %d: %d entries, map has %d", step, s.Len(), len(ref))
		}
		if step%500 == 0 {
			for k, want := range ref {
				p, r := split(k)
				if rec, ok := s.Record(p, r); !ok || rec.Serial != want {
					t.Fatalf("step %d: %s holds %+v, want serial %s", step, k, rec, want)
				}
			}
		}
	}
	got := s.Take(t0.Add(1000*time.Hour), 1<<20)
	if len(got) != len(ref) {
		t.Fatalf("took %d, want %d", len(got), len(ref))
	}
	if s.Len() != 0 {
		t.Fatalf("%d left after expiry", s.Len())
	}
}

func split(k string) (string, string) {
	for i := len(k) - 1; i >= 0; i-- {
		if k[i] == '/' {
			return k[:i], k[i+1:]
		}
	}
	return k, ""
}
