package store

import "context"

type commitNowKey struct{}

// CommitNow marks the transactions run with ctx as ones that others may
// be waiting on: waiting reports, when the backend commits, whether they
// are. A backend that holds a commit a moment for more writers to share
// it (bbolt's group commit) commits a waited-on transaction at once: its
// waiters queue behind it and cannot share its commit anyway.
func CommitNow(ctx context.Context, waiting func() bool) context.Context {
	return context.WithValue(ctx, commitNowKey{}, waiting)
}

// Waited reports whether others wait on the transactions run with ctx
// (see CommitNow).
func Waited(ctx context.Context) bool {
	waiting, _ := ctx.Value(commitNowKey{}).(func() bool)
	return waiting != nil && waiting()
}
