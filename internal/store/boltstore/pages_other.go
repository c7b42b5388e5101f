//go:build !linux

package boltstore

// ReleasePages does nothing where the pages cannot be handed back.
func (s *Store) ReleasePages() error { return nil }
