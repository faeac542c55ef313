//go:build !unix

package envoy

import (
	"errors"
	"os/exec"
)

func setCredential(_ *exec.Cmd, uid, gid int) error {
	if uid >= 0 || gid >= 0 {
		return errors.New("-envoy-uid, -envoy-gid: only on unix")
	}
	return nil
}
