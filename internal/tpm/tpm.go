// Package tpm keeps a Stratum node's key in a TPM 2.0 and proves it: the
// agent side creates and uses a non-exportable P-256 key under the storage
// root key and answers a credential-activation challenge against the
// endorsement key (EK); the listener side (Verify, pure Go) makes that
// challenge and checks the answer. See docs/tpm.md.
//
// All TPM commands go through github.com/google/go-tpm's tpm2 package.
// Every object this package loads is flushed before the call returns, so
// a TPM without a resource manager (swtpm over TCP) does not run out of
// its few transient slots.
package tpm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpm2/transport/linuxtpm"
)

// DefaultDevice is the kernel's resource-managed TPM device.
const DefaultDevice = "/dev/tpmrm0"

// SimPrefix marks a locator that names a simulator's TCP command port.
const SimPrefix = "sim:"

// TPM is an open TPM. Its methods are safe for concurrent use; commands
// are sent one at a time.
type TPM struct {
	mu  sync.Mutex
	t   transport.TPMCloser
	loc string
}

// Open opens the TPM a locator names: a device path (/dev/tpmrm0), or
// "sim:HOST:PORT" for a simulator's command port (swtpm --server
// type=tcp).
func Open(locator string) (*TPM, error) {
	if addr, ok := strings.CutPrefix(locator, SimPrefix); ok {
		return OpenSim(addr)
	}
	t, err := linuxtpm.Open(locator)
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			return nil, fmt.Errorf("open TPM %s: %w (the agent's user needs the device's group, tss on most distributions)", locator, err)
		}
		return nil, fmt.Errorf("open TPM %s: %w", locator, err)
	}
	return &TPM{t: t, loc: locator}, nil
}

// OpenSim connects to a simulator's TCP command port. The simulator must
// already be powered on and started (swtpm --flags startup-clear).
func OpenSim(addr string) (*TPM, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("open TPM simulator %s: %w", addr, err)
	}
	tp := &TPM{t: &tcpTransport{c: c}, loc: SimPrefix + addr}
	// A simulator keeps transient objects across connections: free what
	// an earlier client left behind (a crash between load and flush).
	tp.flushTransient()
	return tp, nil
}

// Locator is what Open was given.
func (t *TPM) Locator() string { return t.loc }

// Close closes the connection; the keys stay in the TPM's hierarchy.
func (t *TPM) Close() error { return t.t.Close() }

// Send implements transport.TPM, serialising commands.
func (t *TPM) Send(cmd []byte) ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.t.Send(cmd)
}

func (t *TPM) flush(h tpm2.TPMHandle) {
	_, _ = tpm2.FlushContext{FlushHandle: h}.Execute(t)
}

func (t *TPM) flushTransient() {
	rsp, err := tpm2.GetCapability{Capability: tpm2.TPMCapHandles, Property: uint32(tpm2.TPMHTTransient) << 24, PropertyCount: 16}.Execute(t)
	if err != nil {
		return
	}
	hs, err := rsp.CapabilityData.Data.Handles()
	if err != nil {
		return
	}
	for _, h := range hs.Handle {
		t.flush(h)
	}
}

// tcpTransport speaks the raw TPM command stream of a simulator socket:
// one command out, one whole response back (header first, then the size
// it gives).
type tcpTransport struct{ c net.Conn }

// rcRetry is TPM_RC_RETRY: the TPM asks for the command again.
const rcRetry = 0x922

func (s *tcpTransport) Send(cmd []byte) ([]byte, error) {
	for try := 0; ; try++ {
		if err := s.c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
			return nil, err
		}
		if _, err := s.c.Write(cmd); err != nil {
			return nil, fmt.Errorf("tpm simulator: %w", err)
		}
		var hdr [10]byte
		if _, err := io.ReadFull(s.c, hdr[:]); err != nil {
			return nil, fmt.Errorf("tpm simulator: %w", err)
		}
		size := binary.BigEndian.Uint32(hdr[2:6])
		if size < 10 || size > 1<<16 {
			return nil, fmt.Errorf("tpm simulator: response of %d bytes", size)
		}
		rsp := make([]byte, size)
		copy(rsp, hdr[:])
		if _, err := io.ReadFull(s.c, rsp[10:]); err != nil {
			return nil, fmt.Errorf("tpm simulator: %w", err)
		}
		if binary.BigEndian.Uint32(hdr[6:10]) == rcRetry && try < 10 {
			time.Sleep(time.Duration(1<<try) * time.Millisecond)
			continue
		}
		return rsp, nil
	}
}

func (s *tcpTransport) Close() error { return s.c.Close() }
