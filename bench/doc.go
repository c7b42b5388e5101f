// Package bench measures the figures README.md holds us to:
// join latency, listener CPU per join against the floor (one QUIC server
// handshake, one OPAQUE KE2, one certificate signature), listener memory,
// Challenge timing for live, inactive and unknown secrets, and the herd.
// Beside the bare floor stand the floor with a join's durable writes as
// appends and fdatasyncs (the least any store could do), and with them as
// the listener's own bbolt transactions (what the design's default store
// costs), so the listener's own share shows. The real agent joins every
// floor as it joins the listener, since a server's CPU per exchange
// depends on how its client paces it; the join figures log the floor
// joined by an instant client beside. The herd's floor is measured before
// and after the herd, and, in three more herds, while it runs, on a
// machine as loaded as the listener's.
// A process's CPU is read from its kernel CPU clock, to the nanosecond
// (the 10 ms ticks of /proc/PID/stat were a tenth of a block of floor
// exchanges); one test checks that clock, another the herd's count of
// the collections a real agent process makes. The rest are benchmarks
// that log their figures: `make bench` and `make herd` run them.
package bench
