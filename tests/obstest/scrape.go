package obstest

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
)

// Scraped reads one series (its name and labels as the exposition writes them)
// from the /metrics page a running service serves at addr; 0 when absent. For a
// service in another process, where there is no registry to gather.
func Scraped(t testing.TB, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindSubmatch(body)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
