package agent

import (
	"errors"
	"strings"
	"testing"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/internal/wire"
)

func TestCloseCodes(t *testing.T) {
	for _, tc := range []struct {
		code     wire.CloseCode
		name     string
		sentence string
		retry    bool
		refused  bool // counted as a failed login
	}{
		{wire.CloseDone, "done", "ended the connection before it answered", true, false},
		{wire.CloseProtocol, "protocol error", "could not read the exchange", true, false},
		{wire.CloseNotProof, "login not proven", "did not accept the login's proof", false, true},
		{wire.CloseInternal, "listener internal error", "failed inside", true, false},
		{wire.CloseAuth, "node certificate not accepted", "did not accept the node certificate", true, false},
		{wire.CloseShutdown, "listener shutting down", "shutting down", true, false},
		{wire.CloseBusy, "listener busy", "too many connections", true, false},
		{0x1ff, "close code 0x1ff", "closed the connection (close code 0x1ff)", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.code.String(); got != tc.name {
				t.Errorf("String() = %q, want %q", got, tc.name)
			}
			err := streamError(&quic.ApplicationError{Remote: true, ErrorCode: quic.ApplicationErrorCode(tc.code)})
			if !strings.Contains(err.Error(), tc.sentence) {
				t.Errorf("error %q does not say %q", err, tc.sentence)
			}
			var closed *ClosedError
			if !errors.As(err, &closed) || closed.Code != tc.code {
				t.Errorf("error %v does not carry code %v", err, tc.code)
			}
			if got := transient(err); got != tc.retry {
				t.Errorf("transient = %v, want %v", got, tc.retry)
			}
			if got := errors.Is(err, ErrNotAccepted); got != tc.refused {
				t.Errorf("is ErrNotAccepted = %v, want %v", got, tc.refused)
			}
		})
	}
	// the agent's own close is the connection breaking, whatever its code
	err := streamError(&quic.ApplicationError{Remote: false, ErrorCode: quic.ApplicationErrorCode(wire.CloseNotProof)})
	var u *UnreachableError
	if !errors.As(err, &u) || errors.Is(err, ErrNotAccepted) {
		t.Errorf("local close: %v, want an UnreachableError", err)
	}
}
