package filecerts

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrOutside is a file resource's path outside every allowed directory.
var ErrOutside = errors.New("outside the directories file resources may be read from (-file-cert-dirs)")

// confine returns where p really is (absolute, cleaned, symlinks resolved) if that
// is under one of roots, each of them resolved the same way. The check is made on
// the cleaned path first, so that a path outside the roots is refused the same way
// whether or not the file exists (no probing the filesystem through NACKs), and
// again on the resolved path, so that neither ".." nor a symlink leads out.
func confine(p string, roots []string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%s: %w", p, err)
	}
	var real []string // the roots that exist, resolved
	lexical := false
	for _, r := range roots {
		if within(abs, filepath.Clean(r)) {
			lexical = true
		}
		if rr, err := filepath.EvalSymlinks(r); err == nil {
			real = append(real, rr)
		}
	}
	if !lexical {
		return "", fmt.Errorf("%s: %w", p, ErrOutside)
	}
	resolved, err := filepath.EvalSymlinks(abs)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("%s: %w", p, os.ErrNotExist)
		}
		return "", fmt.Errorf("%s: %w", p, err)
	}
	for _, r := range real {
		if within(resolved, r) {
			return resolved, nil
		}
	}
	return "", fmt.Errorf("%s (a symlink to %s): %w", p, resolved, ErrOutside)
}

// within reports whether p is dir or below it; both are absolute and clean.
func within(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}
