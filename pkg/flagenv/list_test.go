package flagenv

import (
	"slices"
	"testing"
)

func TestSplitList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{" , ,", nil},
		{"a", []string{"a"}},
		{"a, b,,c ", []string{"a", "b", "c"}},
	} {
		if got := SplitList(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("SplitList(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
