package cli

import (
	"fmt"
	"time"
)

// humanDuration says d the way a person reads it: "3d 4h", "12m 5s", "45s",
// "-2m 1s" (at most two units, rounded down).
func humanDuration(d time.Duration) string {
	sign := ""
	if d < 0 {
		sign, d = "-", -d
	}
	units := []struct {
		name string
		size time.Duration
	}{{"y", 365 * 24 * time.Hour}, {"d", 24 * time.Hour}, {"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}}
	out := ""
	n := 0
	for _, u := range units {
		if d >= u.size || (u.name == "s" && n == 0) {
			if n > 0 {
				out += " "
			}
			out += fmt.Sprintf("%d%s", d/u.size, u.name)
			d %= u.size
			n++
		}
		if n == 2 {
			break
		}
	}
	return sign + out
}
