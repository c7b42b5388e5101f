package e2e

import (
	"fmt"
	mrand "math/rand/v2"
	"net"
	"testing"
)

// freeUDP returns a loopback UDP address nothing listens on now, with a
// port below the kernel's ephemeral range (32768 and up): a port from
// that range, given back and bound again later by a listener process, can
// be handed meanwhile to any other process that binds port 0, as the tests
// and etcd running beside this one do.
func freeUDP(t *testing.T) string {
	t.Helper()
	for range 1000 {
		port := 20000 + mrand.IntN(12000)
		pc, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		addr := pc.LocalAddr().String()
		pc.Close()
		return addr
	}
	t.Fatal("no free UDP port in 20000-31999")
	return ""
}
