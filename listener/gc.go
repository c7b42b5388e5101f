package listener

import (
	"os"
	"runtime/debug"
)

// Garbage collector settings for a serving process (see TuneGC).
const (
	// servingGCPercent lets the heap grow to five times what is live
	// between collections: a join allocates about 300 KiB, nearly all of
	// it garbage at once, and at GOGC=100 the collector's mark work was
	// about 6% of the listener's CPU per join (BenchmarkJoinFigures).
	servingGCPercent = 400
	// connMemory is what one connection may hold: its receive window
	// (connWindow) and quic-go's state of a connection, measured at about
	// 37 KiB (BenchmarkStallRSS: 2,100 held connections, 77 MiB).
	connMemory = connWindow + 48<<10
	// baseMemory is the heap of a listener serving nothing, with room.
	baseMemory = 128 << 20
)

// GCSettings are the collector settings TuneGC applies.
type GCSettings struct {
	Percent int   // -1: left as GOGC says
	Limit   int64 // bytes; 0: left as GOMEMLIMIT says
}

// ServingGC returns the collector settings for a listener with cfg's
// connection bounds: a higher GOGC, which trades memory that is bounded
// anyway for CPU, and a soft memory limit at what the admission bounds let
// the connections hold, so the higher GOGC never grows the heap past the
// stated bound (past it the collector works harder, it does not fail).
// What GOGC or GOMEMLIMIT set in the environment is left alone.
func ServingGC(cfg Config) GCSettings {
	s := GCSettings{Percent: -1}
	if os.Getenv("GOGC") == "" {
		s.Percent = servingGCPercent
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		joins, renewals := cfg.MaxConnections, cfg.MaxRenewals
		if joins <= 0 {
			joins = 2048
		}
		if renewals <= 0 {
			renewals = defaultMaxRenewals
		}
		// everything admitted is bounded by twice the served slots (admit)
		s.Limit = baseMemory + 2*int64(joins+renewals)*connMemory
	}
	return s
}

// Apply sets s process-wide.
func (s GCSettings) Apply() {
	if s.Percent >= 0 {
		debug.SetGCPercent(s.Percent)
	}
	if s.Limit > 0 {
		debug.SetMemoryLimit(s.Limit)
	}
}
