// Package forgedquic sends a QUIC listener what a source that forges its
// address sends: the first flight of a new connection (the Initials of its
// ClientHello) and nothing after, reading nothing, as when those Initials
// carried another machine's address and every answer went there. The
// listener's tests and benches of its admission use it.
package forgedquic

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// firstFlightOnly lets a connection's first two datagrams leave, nothing
// after them, and reads nothing.
type firstFlightOnly struct {
	net.PacketConn
	sent atomic.Int32
}

func (c *firstFlightOnly) WriteTo(p []byte, addr net.Addr) (int, error) {
	if c.sent.Add(1) > 2 {
		return len(p), nil
	}
	return c.PacketConn.WriteTo(p, addr)
}

func (c *firstFlightOnly) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		if _, _, err := c.PacketConn.ReadFrom(p); err != nil {
			return 0, nil, err
		}
	}
}

// Send sends the first flight of a connection for alpn to endpoint from
// from (an address to bind, "127.0.0.1:0" for any port) and returns once
// it has left: its two first datagrams, or its first and 20 ms. The
// returned close ends the connection's sender; closing at once changes
// nothing the listener sees.
func Send(endpoint, from, alpn string) (close func(), err error) {
	to, err := net.ResolveUDPAddr("udp", endpoint)
	if err != nil {
		return nil, err
	}
	pc, err := net.ListenPacket("udp", from)
	if err != nil {
		return nil, err
	}
	fc := &firstFlightOnly{PacketConn: pc}
	tr := &quic.Transport{Conn: fc}
	ctx, cancel := context.WithCancel(context.Background())
	go tr.Dial(ctx, to, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{alpn}, MinVersion: tls.VersionTLS13}, &quic.Config{HandshakeIdleTimeout: time.Minute}) //nolint:errcheck // it never completes
	close = func() {
		cancel()
		tr.Close()
		pc.Close()
	}
	var first time.Time
	for deadline := time.Now().Add(10 * time.Second); fc.sent.Load() < 2; {
		now := time.Now()
		switch {
		case first.IsZero() && fc.sent.Load() == 1:
			first = now
		case !first.IsZero() && now.Sub(first) > 20*time.Millisecond:
			return close, nil
		case now.After(deadline):
			close()
			return nil, fmt.Errorf("forged connection from %s: no datagram sent in 10 s", from)
		}
		time.Sleep(time.Millisecond) // polling for the dial's datagrams
	}
	return close, nil
}
