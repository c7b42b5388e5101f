// Package bench measures the figures README.md holds us to:
// join latency, listener CPU per join against the floor (one QUIC server
// handshake, one OPAQUE KE2, one certificate signature), listener memory,
// Challenge timing for live, inactive and unknown secrets, and the herd.
// It has no tests, only benchmarks that log their figures: `make bench`
// and `make herd` run them.
package bench
