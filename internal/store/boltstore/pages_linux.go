package boltstore

import (
	"fmt"
	"syscall"

	bolt "go.etcd.io/bbolt"
)

// ReleasePages hands the file pages the store's mapping holds back to the
// page cache: a herd of joins reads most of the file through bbolt's
// mapping, and those pages would count in the listener's RSS (and be the
// kernel's last choice to reclaim) until the process ends. The next read
// maps what it needs again from the page cache.
func (s *Store) ReleasePages() error {
	// a read transaction holds bbolt's mapping in place: it is remapped
	// only when no transaction is open
	return s.view(func(tx *bolt.Tx) error {
		data, size := tx.DB().Info().Data, uintptr(tx.Size())
		if size == 0 {
			return nil
		}
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, data, size, syscall.MADV_DONTNEED); errno != 0 {
			return fmt.Errorf("release the store's pages: %w", errno)
		}
		return nil
	})
}
