package fleetindex

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/inventory"
)

// Paging bounds of /api/inventory: a page is what a person reads, never the fleet.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// ParseQuery reads an /api/inventory request's parameters; bad input is an error naming the
// parameter, and nothing is served.
func ParseQuery(v url.Values) (Query, error) {
	q := Query{Namespace: v.Get("ns"), Pod: v.Get("pod"), Root: strings.ToLower(v.Get("root")), Serial: strings.ToLower(v.Get("serial")), State: v.Get("state"),
		Sort: cmp.Or(v.Get("sort"), "expiry"), Desc: v.Get("order") == "desc", Bench: v.Get("bench") == "1", Limit: DefaultLimit}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(v)) {
		// Refused as a bad value is: a misspelt filter must not list the whole fleet.
		if !slices.Contains(inventory.APIParams, name) {
			errs = append(errs, fmt.Errorf("%s: unknown parameter, want one of %s", name, strings.Join(inventory.APIParams, ", ")))
		}
	}
	if !slices.Contains(Sorts, q.Sort) {
		errs = append(errs, fmt.Errorf("sort: %q, want one of %s", q.Sort, strings.Join(Sorts, ", ")))
	}
	if !slices.Contains(States, q.State) {
		errs = append(errs, fmt.Errorf("state: %q, want one of %s", q.State, strings.Join(States[1:], ", ")))
	}
	if o := v.Get("order"); o != "" && o != "asc" && o != "desc" {
		errs = append(errs, fmt.Errorf("order: %q, want asc or desc", o))
	}
	num := func(name string, dst *int, lo, hi int) {
		s := v.Get(name)
		if s == "" {
			return
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < lo || n > hi {
			errs = append(errs, fmt.Errorf("%s: %q, want %d to %d", name, s, lo, hi))
			return
		}
		*dst = n
	}
	if s := q.Serial; s != "" && (len(s) < 6 || len(s) > 64 || strings.Trim(s, "0123456789abcdef") != "") {
		errs = append(errs, fmt.Errorf("serial: %q, want 6 to 64 hex digits", v.Get("serial")))
	}
	num("offset", &q.Offset, 0, 1<<30)
	num("limit", &q.Limit, 1, MaxLimit)
	switch e := v.Get("expiry"); e {
	case "":
	case "expired":
		q.Within = -1
	default:
		d, err := time.ParseDuration(e)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("expiry: %q, want expired or a positive duration (1h)", e))
		}
		q.Within = d
	}
	for name, s := range map[string]string{"ns": q.Namespace, "pod": q.Pod, "root": q.Root} {
		if len(s) > 253 {
			errs = append(errs, fmt.Errorf("%s: longer than 253 bytes", name))
		}
	}
	return q, errors.Join(errs...)
}
