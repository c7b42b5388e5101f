package systemd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/coreos/go-systemd/v22/activation"
)

// Activated holds the sockets systemd passed in, by the name the socket unit
// gave them (FileDescriptorName=; the socket unit's file name when unset).
// Datagram sockets are in PacketConns (a UDP socket is a *net.UDPConn, which
// quic-go needs for its fast paths); listening stream sockets are in
// Listeners. Both maps are non-nil.
type Activated struct {
	PacketConns map[string]net.PacketConn
	Listeners   map[string]net.Listener
}

// Empty reports whether no socket was passed in.
func (a Activated) Empty() bool { return len(a.PacketConns) == 0 && len(a.Listeners) == 0 }

// Close closes every socket that the caller has not taken over.
func (a Activated) Close() error {
	var errs []error
	for _, c := range a.PacketConns {
		errs = append(errs, c.Close())
	}
	for _, l := range a.Listeners {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}

// Activation returns the sockets systemd passed to this process. It returns
// an empty Activated and no error when the process was not socket-activated
// (LISTEN_PID unset or naming another process).
//
// It consumes the activation: LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES are
// removed from the environment, so child processes do not mistake the fds
// for theirs, and any later call returns an empty Activated. Call it once,
// at start-up.
//
// Each name must label exactly one socket: a unit with several Listen* lines
// under one FileDescriptorName= is refused rather than half used.
func Activation() (Activated, error) {
	a := Activated{
		PacketConns: make(map[string]net.PacketConn),
		Listeners:   make(map[string]net.Listener),
	}
	// FilesWithNames unsets LISTEN_* itself; it is the only call that sees
	// the fds (a second call, or PacketConns after ListenersWithNames,
	// finds nothing).
	byName := activation.FilesWithNames()
	var firstErr error
	for name, files := range byName {
		if firstErr == nil && len(files) != 1 {
			firstErr = fmt.Errorf("socket activation: %d sockets named %q, want one", len(files), name)
		}
		for _, f := range files {
			if firstErr == nil {
				if err := a.add(name, f); err != nil {
					firstErr = fmt.Errorf("socket activation: socket %q: %w", name, err)
				}
			}
			_ = f.Close()
		}
	}
	if firstErr != nil {
		_ = a.Close()
		return Activated{PacketConns: map[string]net.PacketConn{}, Listeners: map[string]net.Listener{}}, firstErr
	}
	return a, nil
}

// add converts f into a PacketConn or Listener according to its socket type.
// net.FilePacketConn and net.FileListener duplicate the fd, so the caller
// closes f either way.
func (a *Activated) add(name string, f *os.File) error {
	sotype, listening, err := socketKind(f)
	if err != nil {
		return err
	}
	switch sotype {
	case syscall.SOCK_DGRAM:
		pc, err := net.FilePacketConn(f)
		if err != nil {
			return err
		}
		a.PacketConns[name] = pc
	case syscall.SOCK_STREAM, syscall.SOCK_SEQPACKET:
		if !listening {
			return errors.New("stream socket is not listening (Accept=yes units are not supported)")
		}
		l, err := net.FileListener(f)
		if err != nil {
			return err
		}
		a.Listeners[name] = l
	default:
		return fmt.Errorf("unsupported socket type %d", sotype)
	}
	return nil
}

// socketKind reads SO_TYPE and SO_ACCEPTCONN. Going through SyscallConn
// rather than f.Fd() keeps the fd's non-blocking mode intact.
func socketKind(f *os.File) (sotype int, listening bool, err error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, false, err
	}
	var opErr error
	err = rc.Control(func(fd uintptr) {
		sotype, opErr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TYPE)
		if opErr != nil {
			if errors.Is(opErr, syscall.ENOTSOCK) {
				opErr = errors.New("not a socket")
			}
			return
		}
		var acc int
		acc, opErr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN)
		listening = acc != 0
	})
	if err != nil {
		return 0, false, err
	}
	if opErr != nil {
		return 0, false, opErr
	}
	return sotype, listening, nil
}
