package agent

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// ProtectSecrets keeps this process's memory out of core dumps and out of
// reach of other processes of the same user: it sets RLIMIT_CORE to 0 and
// marks the process not dumpable (PR_SET_DUMPABLE 0, which also refuses
// ptrace and /proc/<pid>/mem to non-root peers). The agent calls it before
// it reads a join secret and keeps it for its whole life, since the node
// key it holds after the join is a secret too.
func ProtectSecrets() error {
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{Cur: 0, Max: 0}); err != nil {
		return fmt.Errorf("set RLIMIT_CORE to 0: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl PR_SET_DUMPABLE 0: %w", err)
	}
	return nil
}
