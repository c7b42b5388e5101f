//go:build !linux

package agent

// ProtectSecrets does nothing outside Linux: the agent runs on Linux
// nodes only, and other systems have no PR_SET_DUMPABLE.
func ProtectSecrets() error { return nil }
