//go:build unix

package envoy

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// setCredential makes cmd run as uid/gid (-1: keep the launcher's), as Istio runs its
// proxy as 1337 so that iptables can tell Envoy's traffic from the app's.
func setCredential(cmd *exec.Cmd, uid, gid int) error {
	if uid < 0 && gid < 0 {
		return nil
	}
	if uid < 0 {
		uid = os.Getuid()
	}
	if gid < 0 {
		gid = os.Getgid()
	}
	if uid == os.Getuid() && gid == os.Getgid() {
		return nil // already there: no privilege needed
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("-envoy-uid %d, -envoy-gid %d: the launcher runs as uid %d and cannot switch (needs root or CAP_SETUID/CAP_SETGID)", uid, gid, os.Geteuid())
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	return nil
}
