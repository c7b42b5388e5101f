// Package bench measures the figures README.md holds us to:
// join latency, listener CPU per join against the floor (one QUIC server
// handshake, one OPAQUE KE2, one certificate signature), listener memory,
// Challenge timing for live, inactive and unknown secrets, and the herd.
// A process's CPU is read from its kernel CPU clock, to the nanosecond
// (the 10 ms ticks of /proc/PID/stat were a tenth of a block of floor
// exchanges); one test checks that clock, another the herd's count of
// the collections a real agent process makes. The rest are benchmarks
// that log their figures: `make bench` and `make herd` run them.
package bench
