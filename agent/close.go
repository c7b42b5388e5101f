package agent

import (
	"errors"
	"fmt"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/internal/wire"
)

// closeMeaning is what the agent makes of a close code the listener sent:
// the sentence it tells its operator, and whether trying again may
// succeed.
type closeMeaning struct {
	sentence string
	retry    bool
}

// closeMeanings is the one place the agent reads the listener's close
// codes (internal/wire names them).
var closeMeanings = map[wire.CloseCode]closeMeaning{
	wire.CloseDone:     {"the listener ended the connection before it answered", true},
	wire.CloseProtocol: {"the listener could not read the exchange (a broken stream, or a frame it does not accept)", true},
	// the listener checked the login's proof and it failed: the same
	// outcome as a failed check here, counted against the code
	wire.CloseNotProof: {"the listener did not accept the login's proof", false},
	wire.CloseInternal: {"the listener failed inside (its log says why)", true},
	// the listener closes with it only when the renewal it wanted to
	// refuse by name did not arrive: a broken stream
	wire.CloseAuth:     {"the listener did not accept the node certificate and could not read the renewal", true},
	wire.CloseShutdown: {"the listener is shutting down", true},
	wire.CloseBusy:     {"the listener holds too many connections", true},
}

func meaningOf(c wire.CloseCode) closeMeaning {
	if m, ok := closeMeanings[c]; ok {
		return m
	}
	// a newer listener's code: the connection is gone, nothing refused
	return closeMeaning{fmt.Sprintf("the listener closed the connection (%s)", c), true}
}

// ClosedError is a connection the listener closed with a close code.
type ClosedError struct{ Code wire.CloseCode }

func (e *ClosedError) Error() string { return meaningOf(e.Code).sentence }

// Retryable reports whether trying again later may succeed.
func (e *ClosedError) Retryable() bool { return meaningOf(e.Code).retry }

// streamError is what an error reading or writing a join or renewal
// stream means: a close by the listener as its code says, anything else
// the connection breaking.
func streamError(err error) error {
	var ae *quic.ApplicationError
	if !errors.As(err, &ae) || !ae.Remote {
		return &UnreachableError{err}
	}
	c := &ClosedError{Code: wire.CloseCode(ae.ErrorCode)}
	switch {
	case c.Code == wire.CloseNotProof:
		return fmt.Errorf("%w (%w)", ErrNotAccepted, c)
	case c.Retryable():
		return &UnreachableError{c}
	}
	return c
}
