// Package systemd is what Stratum Join's two daemons need from systemd: the
// unit files themselves, sd_notify (READY=1, STATUS=, STOPPING=1 and the
// WATCHDOG=1 keep-alive) and socket activation.
//
// The unit files live next to this code and are embedded with go:embed, so
// the tests that run `systemd-analyze verify` on them and `make install`
// (through Install) use exactly the same bytes.
//
//   - stratum-agent.service: Type=notify, the join code as the credential
//     "join-code", restarts on failure except for exit status 1 (refused for
//     good) and 2 (usage), WatchdogSec=60s.
//   - stratum-listener.service with two socket units, because
//     FileDescriptorName= names every socket of a unit:
//     stratum-listener.socket (UDP 9444, fd name "quic") and
//     stratum-listener-admin.socket (/run/stratum/admin.sock, fd name "admin").
//
// Credential reads a credential such as the agent's join code from
// $CREDENTIALS_DIRECTORY.
//
// Outside systemd everything here is a silent no-op: a Notifier without
// NOTIFY_SOCKET sends nothing, WatchdogInterval is 0, and Activation returns
// no sockets, so the daemons run the same way from a shell or a test.
package systemd

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Socket names the listener looks up in Activated, as set by
// FileDescriptorName= in the socket units.
const (
	QUICSocketName  = "quic"
	AdminSocketName = "admin"
)

// UnitDir is where Install puts the unit files below its destination
// directory: the vendor unit directory, so an administrator's copy in
// /etc/systemd/system still wins.
const UnitDir = "lib/systemd/system"

//go:embed stratum-agent.service stratum-listener.service stratum-listener.socket stratum-listener-admin.socket
var units embed.FS

// UnitFiles returns every unit file by name. The map and its byte slices are
// fresh copies on each call.
func UnitFiles() map[string][]byte {
	entries, err := units.ReadDir(".")
	if err != nil {
		// The embedded tree is fixed at build time; failing to list it is a
		// broken build, not a runtime condition.
		panic(fmt.Sprintf("systemd: reading embedded unit files: %v", err))
	}
	out := make(map[string][]byte, len(entries))
	for _, e := range entries {
		b, err := units.ReadFile(e.Name())
		if err != nil {
			panic(fmt.Sprintf("systemd: reading embedded unit %s: %v", e.Name(), err))
		}
		out[e.Name()] = b
	}
	return out
}

// Install writes every unit file to destDir/lib/systemd/system/, mode 0644,
// replacing what is there. destDir is the root of the tree being installed
// into: "/" for the running system, a staging directory for packaging. An
// empty destDir is refused so that a missing DESTDIR can never mean the
// current directory by accident.
//
// Each file is written to a temporary name and renamed into place, so
// systemd never reads a half-written unit. Install does not run
// `systemctl daemon-reload`.
func Install(destDir string) error {
	if destDir == "" {
		return errors.New("install units: empty destination directory (use / for the running system)")
	}
	dir := filepath.Join(destDir, filepath.FromSlash(UnitDir))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("install units: %w", err)
	}
	for name, content := range UnitFiles() {
		if err := writeFileAtomic(dir, name, content, 0o644); err != nil {
			return fmt.Errorf("install unit %s: %w", name, err)
		}
	}
	return nil
}

func writeFileAtomic(dir, name string, content []byte, perm fs.FileMode) (err error) {
	tmp, err := os.CreateTemp(dir, "."+name+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(content); err != nil {
		_ = tmp.Close()
		return err
	}
	// CreateTemp makes the file 0600 and the umask may also have cut bits;
	// set the final mode explicitly.
	if err := tmp.Chmod(perm); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, name))
}
