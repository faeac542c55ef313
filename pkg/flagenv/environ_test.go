package flagenv

import (
	"slices"
	"testing"
)

func TestNamesListsWhatTheGetenvHolds(t *testing.T) {
	getenv := Map(map[string]string{"ISTIO_META_B": "1", "ISTIO_META_A": "2", "ISTIO_META_EMPTY": "", "OTHER": "x"})
	if got := Names(getenv, "ISTIO_META_"); !slices.Equal(got, []string{"ISTIO_META_A", "ISTIO_META_B"}) {
		t.Fatalf("Names = %q", got)
	}
	if got := Names(func(string) string { return "" }, ""); got != nil {
		t.Fatalf("a getenv that cannot list: %q", got)
	}
	t.Setenv("ISTIO_META_FROM_OS", "yes")
	if got := Names(OS, "ISTIO_META_FROM_"); !slices.Equal(got, []string{"ISTIO_META_FROM_OS"}) {
		t.Fatalf("Names(OS) = %q", got)
	}
}
