package auth

import (
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"sync"
)

// File is a principals file and the Set loaded from it. Reload reads the
// file again and replaces the Set's principals in place, so that every
// holder of Set (the gRPC interceptors, the console's sign-in) sees a
// revoked token refused at its next call without a restart. It is safe for
// concurrent use.
type File struct {
	path string
	log  *slog.Logger
	set  *Set
	// mu serialises reloads, so that two signals in a row cannot install
	// the older read last.
	mu sync.Mutex
}

// OpenFile loads the principals file at path (see Parse) and warns on log
// when the file's permissions let other users read it or anyone change it
// (see modeProblem): its tokens are every caller's credentials.
func OpenFile(path string, log *slog.Logger) (*File, error) {
	s, err := readFile(path, log)
	if err != nil {
		return nil, err
	}
	return &File{path: path, log: log, set: s}, nil
}

// Set returns the principals, the same Set for the life of f.
func (f *File) Set() *Set { return f.set }

// Reload reads the file again. If it is readable and valid, the Set's
// principals become the file's at once, the streams whose credential is
// gone or no longer suffices end (see Set.Replace), and Reload logs how
// many principals there are and how many streams ended; otherwise the Set keeps the principals it had, and Reload logs and
// returns why. The coordinator calls it on SIGHUP.
func (f *File) Reload() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := readFile(f.path, f.log)
	if err != nil {
		f.log.Error("reloading the principals file failed; the principals loaded before stay in force", "path", f.path, "err", err)
		return err
	}
	ended := f.set.Replace(s)
	f.log.Info("principals file reloaded", "path", f.path, "principals", s.Len(), "streams_ended", ended)
	return nil
}

// LoadFile reads a principals file (see the package documentation).
func LoadFile(path string) (*Set, error) {
	return readFile(path, slog.New(slog.DiscardHandler))
}

// readFile reads and parses the principals file at path, warning on log
// about its permissions.
func readFile(path string, log *slog.Logger) (*Set, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading principals: %w", err)
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading principals: %w", err)
	}
	if problem := modeProblem(fi); problem != "" {
		log.Warn("the principals file holds every caller's token and "+problem+"; chmod 600 it (or 0440 for a group the coordinator reads it through)",
			"path", path, "mode", fmt.Sprintf("%04o", fi.Mode().Perm()))
	}
	data, err := io.ReadAll(fh)
	if err != nil {
		return nil, fmt.Errorf("reading principals: %w", err)
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("principals file %s: %w", path, err)
	}
	return s, nil
}

// modeProblem says what is wrong with the permissions of a principals
// file, or returns "": it is wrong for others to read or write it, for its
// group to write it, and for its group to read it when the coordinator
// owns the file and so does not need the group's access. A file another
// user owns that the coordinator reads through its group (a Kubernetes
// Secret mounted with mode 0440 and the pod's fsGroup) is fine.
func modeProblem(fi fs.FileInfo) string {
	perm := fi.Mode().Perm()
	switch {
	case !permissionsMean():
		return ""
	case perm&0o006 != 0:
		return "other users may read or change it"
	case perm&0o020 != 0:
		return "its group may change it"
	case perm&0o040 != 0 && ownedByUs(fi):
		return "its group may read it"
	}
	return ""
}
