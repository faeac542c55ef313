//go:build unix

package policy

import (
	"io/fs"
	"os"
	"syscall"
)

// fileGID is the group owning the file fi describes.
func fileGID(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Gid)
	}
	return -1
}

// processGIDs are the process's effective and supplementary groups.
func processGIDs() []int {
	groups, _ := os.Getgroups()
	return append(groups, os.Getegid())
}
