package auditlog

import (
	"errors"
	"fmt"
	"os"
	"sync"
)

// Sink appends JSON lines to a file and rotates it by size: when the next line
// would take the file past MaxBytes, path becomes path.1 (path.1 becomes path.2, and
// so on; Keep files are kept besides the current one) and a new path is started.
type Sink struct {
	Path     string
	MaxBytes int64 // > 0
	Keep     int   // rotated files kept; 0 keeps none

	mu   sync.Mutex
	f    *os.File
	size int64
}

// NewSink checks the settings; the file is opened on the first write.
func NewSink(path string, maxBytes int64, keep int) (*Sink, error) {
	var errs []error
	if path == "" {
		errs = append(errs, errors.New("path: required"))
	}
	if maxBytes < 1024 {
		errs = append(errs, fmt.Errorf("max bytes: %d, want at least 1024", maxBytes))
	}
	if keep < 0 {
		errs = append(errs, fmt.Errorf("keep: %d, must not be negative", keep))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Sink{Path: path, MaxBytes: maxBytes, Keep: keep}, nil
}

// Write appends one entry as one line.
func (s *Sink) Write(e Entry) error {
	line, err := e.JSON()
	if err != nil {
		return err
	}
	line = append(line, '\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f != nil && s.size > 0 && s.size+int64(len(line)) > s.MaxBytes {
		if err := s.rotate(); err != nil {
			return err
		}
	}
	if s.f == nil {
		if err := s.open(); err != nil {
			return err
		}
	}
	n, err := s.f.Write(line)
	s.size += int64(n)
	if err != nil {
		return fmt.Errorf("audit file %s: %w", s.Path, err)
	}
	return nil
}

func (s *Sink) open() error {
	f, err := os.OpenFile(s.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("audit file: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("audit file: %w", err)
	}
	s.f, s.size = f, st.Size()
	return nil
}

func (s *Sink) rotate() error {
	if err := s.f.Close(); err != nil {
		return fmt.Errorf("audit file %s: %w", s.Path, err)
	}
	s.f = nil
	if s.Keep == 0 {
		return os.Remove(s.Path)
	}
	_ = os.Remove(fmt.Sprintf("%s.%d", s.Path, s.Keep))
	for i := s.Keep - 1; i >= 1; i-- {
		if err := os.Rename(fmt.Sprintf("%s.%d", s.Path, i), fmt.Sprintf("%s.%d", s.Path, i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rotate audit file: %w", err)
		}
	}
	if err := os.Rename(s.Path, s.Path+".1"); err != nil {
		return fmt.Errorf("rotate audit file: %w", err)
	}
	return nil
}

// Close closes the current file.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}
