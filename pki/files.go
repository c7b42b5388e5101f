package pki

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

const (
	secretFileMode = 0o600
	secretDirMode  = 0o700
)

// WriteSecretFile replaces path with data atomically: data goes to a
// temporary 0600 file in the same directory, is synced, and is renamed over
// path, so a reader sees the old or the new content, never a torn or
// world-readable file. The directory is created 0700 if missing and must
// otherwise be closed to group and others and owned by us (or root). An
// existing file's mode is never widened: a 0400 file stays 0400, a 0644 one
// becomes 0600.
func WriteSecretFile(path string, data []byte) error {
	if err := ensurePrivateDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	mode := os.FileMode(secretFileMode)
	if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() {
		mode = fi.Mode().Perm() & secretFileMode
	}
	if err := writeAtomic(path, data, mode, false); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// WriteFile is WriteSecretFile for files that may be public, such as a
// certificate: the same temporary file, sync and rename, ending with mode.
// A missing directory is created 0700; an existing one is left as it is.
func WriteFile(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, secretDirMode); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	if err := writeAtomic(path, data, mode.Perm(), false); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// CreateSecretFile is WriteSecretFile that refuses to replace an existing
// file: the final step is link(2), which fails if path exists, so of two
// racing writers exactly one wins. The error wraps fs.ErrExist.
func CreateSecretFile(path string, data []byte) error {
	if err := ensurePrivateDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if err := writeAtomic(path, data, secretFileMode, true); err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	return nil
}

func writeAtomic(path string, data []byte, mode os.FileMode, exclusive bool) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	// CreateTemp opens with O_EXCL and mode 0600: the content is never
	// readable by others, whatever the umask.
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Chmod(mode); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if exclusive {
		if err = os.Link(tmp, path); err != nil {
			return err
		}
		// The content is in place under path; a leftover temporary name
		// would only be clutter, so its removal error does not matter.
		os.Remove(tmp)
	} else if err = os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir makes a rename, link or removal in dir durable: it fsyncs the
// directory itself.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// ensurePrivateDir creates dir 0700 if it is missing, and otherwise checks
// that no one but its owner, who must be us or root, can enter it.
func ensurePrivateDir(dir string) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, secretDirMode); err != nil {
			return err
		}
		fi, err = os.Stat(dir)
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("directory %s has mode %#o; it must be closed to group and others (0700)", dir, perm)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if uid := os.Geteuid(); int(st.Uid) != uid && st.Uid != 0 {
			return fmt.Errorf("directory %s is owned by uid %d, not by us (uid %d) or root", dir, st.Uid, uid)
		}
	}
	return nil
}

// File is one file for WriteFiles.
type File struct {
	Name string // in the directory
	Data []byte
	Mode os.FileMode
}

// WriteFiles replaces several files of one directory, each atomically and
// in the order given, with a single directory sync at the end: a crash
// leaves every file either old or new, and a later file (a commit marker
// such as node.json) never new while an earlier one is old.
func WriteFiles(dir string, files []File) error {
	if err := ensurePrivateDir(dir); err != nil {
		return err
	}
	tmps := make([]string, 0, len(files))
	defer func() {
		for _, t := range tmps {
			os.Remove(t) // after a successful rename the name is gone already
		}
	}()
	for _, f := range files {
		t, err := os.CreateTemp(dir, "."+f.Name+".tmp-*")
		if err != nil {
			return err
		}
		tmps = append(tmps, t.Name())
		_, err = t.Write(f.Data)
		if err == nil {
			err = t.Chmod(f.Mode)
		}
		if err == nil {
			err = t.Sync()
		}
		if cerr := t.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	for i, f := range files {
		if err := os.Rename(tmps[i], filepath.Join(dir, f.Name)); err != nil {
			return err
		}
	}
	return SyncDir(dir)
}
