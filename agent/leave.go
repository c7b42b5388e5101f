package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/stratumjoin/stratum/internal/wire"
)

// Leave takes this node out of the cluster: over mutual TLS under its
// current certificate it asks the listener to revoke it, and once the
// listener answers that it did, wipes the state directory (Wipe). A
// refusal (a *RefusedError) or an unreachable listener (an
// *UnreachableError) leaves the state as it was, so the leave can be
// tried again.
func Leave(ctx context.Context, cfg RenewConfig) (Identity, error) {
	ns, err := openNode(ctx, &cfg)
	if err != nil {
		return ns.id, err
	}
	defer ns.close()
	if err := wire.Write(ns.str, &wire.Leave{}); err != nil {
		return ns.id, &UnreachableError{err}
	}
	var res wire.Result
	if err := wire.Read(ns.str, &res); err != nil {
		if errors.Is(err, wire.ErrFrame) {
			return ns.id, fmt.Errorf("listener sent a malformed result: %w", err)
		}
		return ns.id, &UnreachableError{err}
	}
	if res.Status != wire.StatusLeft {
		return ns.id, refusal(&res)
	}
	if res.NodeID != ns.id.NodeID {
		return ns.id, fmt.Errorf("listener revoked node %q, not %q", res.NodeID, ns.id.NodeID)
	}
	ns.close()
	if err := ns.st.Wipe(); err != nil {
		return ns.id, &localError{err}
	}
	return ns.id, nil
}

// stateFiles are every file the agent keeps in its state directory.
var stateFiles = []string{KeyFile, TPMPublicFile, TPMPrivateFile, CertFile, CAFile, NodeFile, PendingFile, failuresFile, attemptsFile}

// Wipe removes the node's key (or its TPM blobs), certificate, pinned
// CA bundle, identity and the agent's bookkeeping from the state
// directory. The directory itself stays (systemd's StateDirectory= owns
// it).
func (s State) Wipe() error {
	var errs []error
	for _, name := range stateFiles {
		if err := os.Remove(s.path(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("wipe state: %w", err)
	}
	return nil
}
