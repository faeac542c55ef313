package secrets

import (
	"errors"
	"testing"

	"github.com/meshagent/meshagent/pkg/sdsclient"
)

type resolver map[string]error

func (r resolver) Resolve(name string) error { return r[name] }

func TestCheckNames(t *testing.T) {
	s := New(resolver{"file-root:/ok": nil, "file-root:/missing": errors.New("no such file")})
	for _, tc := range []struct {
		name    string
		unknown bool
	}{
		{"default", false},
		{"ROOTCA", false},
		{"file-root:/ok", false},
		{"file-root:/missing", true},
		{"Default", true},
		{"", true},
		{"spiffe://cluster.local/ns/x/sa/y", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Check(tc.name)
			if got := errors.Is(err, ErrUnknown); got != tc.unknown {
				t.Fatalf("Check(%q) = %v, want unknown=%t", tc.name, err, tc.unknown)
			}
		})
	}
	if err := New(nil).Check("file-cert:/a~/b"); !errors.Is(err, ErrUnknown) {
		t.Fatalf("file resource without a resolver: %v", err)
	}
}

func TestSetWakesOnlyWatchersAndVersions(t *testing.T) {
	s := New(nil)
	wDef, wRoot := s.NewWatch(), s.NewWatch()
	defer wDef.Close()
	defer wRoot.Close()
	wDef.Set([]string{Default})
	wRoot.Set([]string{RootCA})

	e1, n := s.Set(sdsclient.Secret{Name: RootCA, TrustedCA: []byte("roots-1")})
	if n != 1 || e1.Version != "1" {
		t.Fatalf("set = %+v %d", e1, n)
	}
	select {
	case <-wRoot.C():
	default:
		t.Fatal("ROOTCA watch not woken")
	}
	select {
	case <-wDef.C():
		t.Fatal("default watch woken by a ROOTCA change")
	default:
	}
	// The same value again is not a change.
	e2, n := s.Set(sdsclient.Secret{Name: RootCA, TrustedCA: []byte("roots-1")})
	if e2 != e1 || n != 0 {
		t.Fatalf("identical set made version %s and woke %d", e2.Version, n)
	}
	e3, _ := s.Set(sdsclient.Secret{Name: RootCA, TrustedCA: []byte("roots-2")})
	if e3.Version != "2" {
		t.Fatalf("version %s, want 2", e3.Version)
	}
	if s.Watching(RootCA) != 1 || s.Watching(Default) != 1 {
		t.Fatal("watch counts")
	}
	if got := s.Snapshot([]string{Default, RootCA}); len(got) != 1 || got[0] != e3 {
		t.Fatalf("snapshot = %v", got)
	}
}
