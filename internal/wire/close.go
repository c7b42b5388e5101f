package wire

import "fmt"

// CloseCode is a QUIC application close code of a join or renewal
// connection. The listener closes with one; the agent maps each to what it
// tells its operator and whether it tries again (agent/close.go).
type CloseCode uint64

// Close codes. Their values are on the wire: never renumber one.
const (
	CloseDone     CloseCode = 0     // the exchange ended as the protocol says
	CloseProtocol CloseCode = 0x101 // a frame was malformed or out of order
	CloseNotProof CloseCode = 0x102 // the OPAQUE login failed (sent by either side)
	CloseInternal CloseCode = 0x103 // the listener failed inside
	CloseAuth     CloseCode = 0x104 // the node certificate was not accepted
	CloseShutdown CloseCode = 0x105 // the listener is shutting down
	CloseBusy     CloseCode = 0x106 // the listener holds too many connections
)

var closeNames = map[CloseCode]string{
	CloseDone:     "done",
	CloseProtocol: "protocol error",
	CloseNotProof: "login not proven",
	CloseInternal: "listener internal error",
	CloseAuth:     "node certificate not accepted",
	CloseShutdown: "listener shutting down",
	CloseBusy:     "listener busy",
}

func (c CloseCode) String() string {
	if n, ok := closeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("close code %#x", uint64(c))
}
