package supervisor

import (
	"strings"
	"testing"
)

func TestFindBinaryNamesWhatItTried(t *testing.T) {
	_, err := FindBinary(t.TempDir(), "no-such-service-binary")
	if err == nil || !strings.Contains(err.Error(), "make build") {
		t.Fatalf("err = %v", err)
	}
}
