package listener

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratumjoin/stratum/listener/adminapi"
)

type adminServer struct {
	srv *http.Server
	ln  net.Listener
}

func (a *adminServer) run() error {
	if err := a.srv.Serve(a.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("admin socket: %w", err)
	}
	return nil
}

func (a *adminServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return a.srv.Shutdown(ctx)
}

// serveAdmin listens on the admin unix socket (0600, in a 0700 directory)
// and identifies each caller by SO_PEERCRED: root and the listener's own
// user are the bootstrap admin; anyone else is refused.
func (l *Listener) serveAdmin(ctx context.Context) (*adminServer, error) {
	ln := l.cfg.AdminListener
	if ln == nil {
		path := l.cfg.AdminSocket
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("admin socket dir: %w", err)
		}
		if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
			os.Remove(path) // a stale socket from a previous run
		}
		old := unix.Umask(0o177)
		var err error
		ln, err = net.Listen("unix", path)
		unix.Umask(old)
		if err != nil {
			return nil, fmt.Errorf("admin socket: %w", err)
		}
		if err := os.Chmod(path, 0o600); err != nil {
			ln.Close()
			return nil, fmt.Errorf("admin socket: %w", err)
		}
	}
	api := l.adminAPI()
	me := os.Geteuid()
	srv := &http.Server{
		Handler:           api,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			uc, ok := c.(*net.UnixConn)
			if !ok {
				return ctx
			}
			raw, err := uc.SyscallConn()
			if err != nil {
				return ctx
			}
			var cred *unix.Ucred
			_ = raw.Control(func(fd uintptr) {
				cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
			})
			if err != nil || cred == nil {
				return ctx
			}
			return adminapi.WithPrincipal(ctx, adminapi.Principal{
				Name:  fmt.Sprintf("uid:%d", cred.Uid),
				Admin: cred.Uid == 0 || int(cred.Uid) == me,
			})
		},
	}
	return &adminServer{srv: srv, ln: ln}, nil
}
