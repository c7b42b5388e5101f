package boltstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"

	"github.com/stratumjoin/stratum/internal/store"
)

// WriteTo writes a consistent copy of the file to w from one read
// transaction, while writers go on (bbolt's Tx.WriteTo).
func (s *Store) WriteTo(w io.Writer) (n int64, err error) {
	err = s.view(func(tx *bolt.Tx) error {
		var werr error
		n, werr = tx.WriteTo(w)
		return werr
	})
	return n, err
}

// Snapshot writes a backup of src to w as a bbolt file that Open (and
// `store restore`) accepts: the file itself for a bbolt store, or, for a
// store.Dumper such as etcd, everything it holds at one revision, copied
// into a temporary bbolt file in tmpDir first.
func Snapshot(ctx context.Context, src store.Store, tmpDir string, w io.Writer) (int64, error) {
	switch b := store.Unwrap(src).(type) {
	case *Store:
		return b.WriteTo(w)
	case store.Dumper:
		dir, err := os.MkdirTemp(tmpDir, "stratum-backup")
		if err != nil {
			return 0, err
		}
		defer os.RemoveAll(dir)
		tmp, err := Open(filepath.Join(dir, "state.db"), Options{})
		if err != nil {
			return 0, err
		}
		defer tmp.Close()
		err = b.Dump(ctx, func(kvs []store.KV) error {
			for len(kvs) > 0 {
				n := min(len(kvs), store.MaxTxnOps)
				ops := make([]store.Op, 0, n)
				for _, kv := range kvs[:n] {
					ops = append(ops, store.Op{Key: kv.Key, Value: kv.Value})
				}
				if _, err := tmp.Txn(ctx, nil, ops); err != nil {
					return fmt.Errorf("copy into the backup: %w", err)
				}
				kvs = kvs[n:]
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
		return tmp.WriteTo(w)
	}
	return 0, errors.New("this store cannot be backed up while serving")
}

// Restore writes the backup file from into a new store file at path: it
// checks the backup as Open does, refuses to overwrite an existing file,
// and writes 0600 through a temporary file that is synced and renamed.
func Restore(from, path string) error {
	if err := Check(from); err != nil {
		return fmt.Errorf("the backup %s: %w", from, err)
	}
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("%s exists: restore into a new data directory (or move it aside first)", path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".restore-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return store.NameSpace(fmt.Errorf("write %s: %w", path, err))
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return store.NameSpace(fmt.Errorf("write %s: %w", path, err))
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
