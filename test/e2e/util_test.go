package e2e

import (
	"net"
	"testing"
)

// freeUDP returns a loopback UDP address nothing listens on right now.
func freeUDP(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().String()
}
