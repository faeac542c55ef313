package policy

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

func TestCheckSecret(t *testing.T) {
	const own, other = 1000, 2000
	groups := []int{own, 5}
	tests := []struct {
		name string
		mode fs.FileMode
		gid  int
		dir  bool
		want string // "" = accepted
	}{
		{name: "owner read-write", mode: 0o600, gid: other},
		{name: "owner read-only", mode: 0o400, gid: other},
		{name: "group read, own effective group", mode: 0o440, gid: own},
		{name: "group read, own supplementary group", mode: 0o440, gid: 5},
		{name: "owner write, group read, own group", mode: 0o640, gid: own},
		{name: "group read, another group", mode: 0o440, gid: other, want: "its group 2000 is not one of this process's"},
		{name: "group read, group unknown", mode: 0o440, gid: -1, want: "is not one of this process's"},
		{name: "group write, own group", mode: 0o460, gid: own, want: "its group may write"},
		{name: "group exec, own group", mode: 0o450, gid: own, want: "its group may write or execute"},
		{name: "world readable", mode: 0o444, gid: own, want: "others may access it"},
		{name: "world readable only", mode: 0o604, gid: own, want: "others may access it"},
		{name: "world writable", mode: 0o602, gid: own, want: "others may access it"},
		{name: "Kubernetes default 0644", mode: 0o644, gid: own, want: "mode 0644"},
		{name: "a directory", mode: 0o700, gid: own, dir: true, want: "not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "secret")
			if tt.dir {
				if err := os.Mkdir(p, 0o700); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, tt.mode); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			err = checkSecret(p, fi, tt.gid, groups)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrSecretMode) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), p) {
				t.Fatalf("err = %v, want %q naming the file", err, tt.want)
			}
		})
	}
}

// ReadSeed takes a seed as Kubernetes mounts it for a non-root container (0440,
// the pod's fsGroup, which the process has), and still refuses a seed others can read.
func TestReadSeedModes(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	write := func(mode fs.FileMode) string {
		p := filepath.Join(t.TempDir(), "svc.nk")
		if err := os.WriteFile(p, seed, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A temp file belongs to this process's effective group.
	if _, err := ReadSeed(write(0o440), nkeys.PrefixByteUser); err != nil {
		t.Fatalf("group-readable seed of the process's own group: %v", err)
	}
	if _, err := ReadSeed(write(0o644), nkeys.PrefixByteUser); !errors.Is(err, ErrSecretMode) {
		t.Fatalf("world-readable seed: %v", err)
	}
	// Another group: only root can make one here.
	p := write(0o440)
	if err := os.Chown(p, -1, os.Getegid()+4242); err != nil {
		t.Skipf("cannot give the file another group (not root): %v", err)
	}
	if _, err := ReadSeed(p, nkeys.PrefixByteUser); !errors.Is(err, ErrSecretMode) || !strings.Contains(err.Error(), "is not one of this process's") {
		t.Fatalf("seed readable by another group: %v", err)
	}
}
