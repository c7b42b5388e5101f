package boltstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"runtime"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"

	"github.com/stratumjoin/stratum/internal/store"
)

// The bbolt file layout this package checks before it lets bbolt map a
// file: two meta pages at the start, each a 16-byte page header followed
// by magic, version, page size, flags, the root bucket (root page and
// sequence), the freelist page, the high-water page id, the transaction
// id and an FNV-64a checksum of what precedes it (bbolt's
// internal/common/meta.go). A file shorter than its high-water mark was
// truncated: bbolt would fault on the missing pages.
const (
	pageHeaderLen = 16
	metaMagic     = 0xED0CDAED
	metaLen       = 4*4 + 16 + 8 + 8 + 8 + 8 // through checksum
	minPageSize   = 512
	// minFileLen is the smallest file bbolt writes: two meta pages, a
	// freelist page and an empty root leaf, of at least 1 KiB each.
	minFileLen = 4 * 1024
)

type metaPage struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64
	txid     uint64
}

// readMeta decodes the meta page at off, or says why it is not one.
func readMeta(f *os.File, off int64) (metaPage, error) {
	buf := make([]byte, pageHeaderLen+metaLen)
	if _, err := f.ReadAt(buf, off); err != nil {
		return metaPage{}, err
	}
	m := buf[pageHeaderLen:]
	le := binary.LittleEndian
	if le.Uint32(m[0:]) != metaMagic {
		return metaPage{}, errors.New("no bbolt meta page (bad magic)")
	}
	h := fnv.New64a()
	h.Write(m[:metaLen-8])
	if h.Sum64() != le.Uint64(m[metaLen-8:]) {
		return metaPage{}, errors.New("meta page checksum mismatch")
	}
	mp := metaPage{pageSize: le.Uint32(m[8:]), root: le.Uint64(m[16:]), freelist: le.Uint64(m[32:]), pgid: le.Uint64(m[40:]), txid: le.Uint64(m[48:])}
	if mp.pageSize < minPageSize || mp.pageSize&(mp.pageSize-1) != 0 {
		return metaPage{}, fmt.Errorf("meta page names page size %d", mp.pageSize)
	}
	return mp, nil
}

// recovery is the advice every refusal of a damaged file ends with.
const recovery = "restore it from a backup with `stratum-listener store restore BACKUP --data-dir DIR` (see docs/store.md), or move it aside to start with an empty store"

// checkFile refuses, before bbolt maps it, an existing file that is empty,
// shorter than any file bbolt writes, without a valid meta page, or
// shorter than the pages its meta page says it holds. A missing file is
// fine: Open creates it.
func checkFile(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open store file %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat store file %s: %w", path, err)
	}
	size := fi.Size()
	switch {
	case size == 0:
		return fmt.Errorf("%w: store file %s is empty (0 bytes): every node, code and counter it held is gone; %s", store.ErrCorrupt, path, recovery)
	case size < minFileLen:
		return fmt.Errorf("%w: store file %s is %d bytes, shorter than any bbolt file: it was truncated; %s", store.ErrCorrupt, path, size, recovery)
	}
	m0, err0 := readMeta(f, 0)
	var m1 metaPage
	err1 := errors.New("no first meta page")
	if err0 == nil {
		m1, err1 = readMeta(f, int64(m0.pageSize))
	} else {
		// the first meta page is damaged: look for the second at each
		// page size bbolt may have used
		for ps := int64(minPageSize); ps <= 64<<10 && err1 != nil; ps *= 2 {
			m1, err1 = readMeta(f, ps)
		}
	}
	var m metaPage
	switch {
	case err0 != nil && err1 != nil:
		if errors.Is(err0, io.EOF) {
			err0 = errors.New("file ends inside the meta page")
		}
		return fmt.Errorf("%w: store file %s has no valid meta page (%v): %s", store.ErrCorrupt, path, err0, recovery)
	case err0 != nil:
		m = m1
	case err1 != nil || m0.txid >= m1.txid:
		m = m0
	default:
		m = m1
	}
	if m.pgid > uint64(size) || int64(m.pgid)*int64(m.pageSize) > size {
		return fmt.Errorf("%w: store file %s is %d bytes but holds %d pages of %d bytes: it was truncated; %s", store.ErrCorrupt, path, size, m.pgid, m.pageSize, recovery)
	}
	if m.root < 2 || m.root >= m.pgid {
		return fmt.Errorf("%w: store file %s names root page %d of %d: %s", store.ErrCorrupt, path, m.root, m.pgid, recovery)
	}
	// The freelist is read whole when bbolt opens the file, its length
	// taken from the page: a damaged length would make bbolt allocate
	// without bound before any check could run.
	if m.freelist != ^uint64(0) {
		if m.freelist < 2 || m.freelist >= m.pgid {
			return fmt.Errorf("%w: store file %s names freelist page %d of %d: %s", store.ErrCorrupt, path, m.freelist, m.pgid, recovery)
		}
		hdr := make([]byte, pageHeaderLen+8)
		if _, err := f.ReadAt(hdr, int64(m.freelist)*int64(m.pageSize)); err != nil {
			return fmt.Errorf("%w: store file %s: read the freelist page: %v; %s", store.ErrCorrupt, path, err, recovery)
		}
		le := binary.LittleEndian
		flags, count, overflow := le.Uint16(hdr[8:]), uint64(le.Uint16(hdr[10:])), uint64(le.Uint32(hdr[12:]))
		if count == 0xFFFF {
			count = le.Uint64(hdr[pageHeaderLen:]) + 1
		}
		if flags != 0x10 || overflow >= m.pgid || count*8 > (overflow+1)*uint64(m.pageSize) {
			return fmt.Errorf("%w: store file %s has a damaged freelist page: %s", store.ErrCorrupt, path, recovery)
		}
	}
	return nil
}

// consistent reads every key and value of the file, then runs bbolt's
// page check. The read comes first, in this goroutine under guard: bbolt
// runs its check in a goroutine of its own, where a fault on a damaged
// offset would kill the process instead of failing the check.
func (s *Store) consistent() error {
	var touched byte // keeps the reads of values from being elided
	defer runtime.KeepAlive(&touched)
	err := s.view(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			var prev []byte
			c := b.Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				if prev != nil && bytes.Compare(prev, k) >= 0 {
					return fmt.Errorf("bucket %s: keys out of order", name)
				}
				if bytes.Equal(name, bucketKV) && len(v) < revLen {
					return fmt.Errorf("bucket %s: a record of %d bytes", name, len(v))
				}
				if len(v) > 0 { // touch both ends: a bad length faults here, under guard
					touched ^= v[0] ^ v[len(v)-1]
				}
				prev = k
			}
			return nil
		})
	})
	if err != nil {
		if !errors.Is(err, store.ErrCorrupt) {
			err = fmt.Errorf("%w: store file %s fails its consistency check: %w; %s", store.ErrCorrupt, s.path, err, recovery)
		}
		s.broken.Store(nil)
		return err
	}
	var errs []error
	err = s.view(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			errs = append(errs, err)
			if len(errs) == 5 {
				break
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: store file %s fails its consistency check: %w; %s", store.ErrCorrupt, s.path, errors.Join(errs...), recovery)
	}
	return nil
}

// Check opens nothing: it checks the file at path as Open does (size, meta
// pages, bbolt's page check) and reports what it finds. It takes the file
// lock, so it fails while a listener has the file open.
func Check(path string) error {
	s, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		return err
	}
	return s.Close()
}

// guard turns a panic or a memory fault inside a bbolt transaction into an
// error at the store boundary, and marks the store broken (see Healthy).
// bbolt rolls its transaction back as the panic passes.
func (s *Store) guard(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: store file %s fails its consistency check: a transaction hit a damaged page (%v); %s", store.ErrCorrupt, s.path, r, recovery)
			s.broken.CompareAndSwap(nil, &err)
		}
	}()
	return fn()
}

func (s *Store) view(fn func(*bolt.Tx) error) error {
	return s.guard(func() error { return s.db.View(fn) })
}

func (s *Store) update(fn func(*bolt.Tx) error) error {
	return s.guard(func() error { return s.db.Update(fn) })
}

// Healthy reports the first damage a transaction met, nil while none. A
// listener stops answering ready once it is not nil.
func (s *Store) Healthy() error {
	if p := s.broken.Load(); p != nil {
		return *p
	}
	return nil
}
