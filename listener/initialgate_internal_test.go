package listener

import (
	"bytes"
	"net"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
)

// initialHeader is the start of a long-header packet: first byte, version.
func initialHeader(first byte, version uint32) []byte {
	return []byte{first, byte(version >> 24), byte(version >> 16), byte(version >> 8), byte(version), 8, 1, 2, 3, 4, 5, 6, 7, 8}
}

func TestIsInitial(t *testing.T) {
	for _, tc := range []struct {
		name   string
		packet []byte
		want   bool
	}{
		{"v1 Initial", initialHeader(0xc3, quicV1), true},
		{"v1 Initial, other reserved and length bits", initialHeader(0xcc, quicV1), true},
		{"v1 0-RTT", initialHeader(0xd3, quicV1), false},
		{"v1 Handshake", initialHeader(0xe3, quicV1), false},
		{"v1 Retry", initialHeader(0xf3, quicV1), false},
		{"v2 Initial", initialHeader(0xd3, quicV2), true},
		{"v2 type 0 (0-RTT)", initialHeader(0xc3, quicV2), false},
		{"version negotiation", initialHeader(0xc0, 0), false},
		{"unknown version", initialHeader(0xc3, 0x1a2a3a4a), false},
		{"short header", []byte{0x43, 1, 2, 3, 4, 5, 6}, false},
		{"fixed bit clear", initialHeader(0x83, quicV1), false},
		{"too short for a version", []byte{0xc3, 0, 0, 1}, false},
		{"empty", nil, false},
	} {
		if got := isInitial(tc.packet); got != tc.want {
			t.Errorf("%s (% x): isInitial %v, want %v", tc.name, tc.packet, got, tc.want)
		}
	}
}

// FuzzIsInitial: any datagram is classified without panicking, and an
// Initial is always a long header of version 1 or 2.
func FuzzIsInitial(f *testing.F) {
	f.Add(initialHeader(0xc3, quicV1))
	f.Add(initialHeader(0xd3, quicV2))
	f.Add([]byte{0x43, 1, 2})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, packet []byte) {
		if !isInitial(packet) {
			return
		}
		v := uint32(packet[1])<<24 | uint32(packet[2])<<16 | uint32(packet[3])<<8 | uint32(packet[4])
		if packet[0]&0xc0 != 0xc0 || (v != quicV1 && v != quicV2) {
			t.Fatalf("% x taken for an Initial", packet)
		}
	})
}

// TestGatedConnLeavesOutDropped: over a real UDP socket, ReadBatch returns
// the datagrams the gate keeps, in order, each whole and with its source,
// and none it drops, however the kernel batches them.
func TestGatedConnLeavesOutDropped(t *testing.T) {
	server, client := udpPair(t)
	drop := func(p []byte, _ net.Addr) bool { return bytes.HasPrefix(p, []byte("drop")) }
	gc := newGatedConn(server, func(d heldDatagram) bool { return !drop(d.data, d.from) })

	sent := []string{"drop 0", "keep 1", "drop 2", "drop 3", "keep 4 " + string(bytes.Repeat([]byte("x"), 1200)), "keep 5", "drop 6", "drop 7"}
	for _, p := range sent {
		if _, err := client.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for _, p := range sent {
		if !drop([]byte(p), nil) {
			want = append(want, p)
		}
	}
	// as quic-go reads: a buffer a message, the same buffer at the same
	// index every batch
	ms := quicGoMessages(4)
	server.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []string
	for len(got) < len(want) {
		bufs := make([][]byte, len(ms))
		for i := range ms {
			bufs[i] = ms[i].Buffers[0]
		}
		n, err := gc.ReadBatch(ms, 0)
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		for i := range n {
			if &ms[i].Buffers[0][0] != &bufs[i][0] {
				t.Fatalf("message %d's buffer was swapped", i)
			}
			if ms[i].Addr.String() != client.LocalAddr().String() {
				t.Fatalf("message %d from %v, want %v", i, ms[i].Addr, client.LocalAddr())
			}
			got = append(got, string(ms[i].Buffers[0][:ms[i].N]))
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("read %q, want %q", got, want)
	}
}

// TestGatedConnKeepsOddBatches: buffers of another shape than quic-go's
// (here of two sizes) are returned as read, dropped packets included,
// rather than moved where one might not fit.
func TestGatedConnKeepsOddBatches(t *testing.T) {
	server, client := udpPair(t)
	gc := newGatedConn(server, func(d heldDatagram) bool { return !bytes.HasPrefix(d.data, []byte("drop")) })
	sent := []string{"drop 0", "keep 1"}
	for _, p := range sent {
		if _, err := client.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	ms := []ipv4.Message{{Buffers: [][]byte{make([]byte, 1500)}}, {Buffers: [][]byte{make([]byte, 64)}}}
	server.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []string
	for len(got) < len(sent) {
		n, err := gc.ReadBatch(ms, 0)
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		for i := range n {
			got = append(got, string(ms[i].Buffers[0][:ms[i].N]))
		}
	}
	if !slices.Equal(got, sent) {
		t.Fatalf("read %q, want %q as sent", got, sent)
	}
}
