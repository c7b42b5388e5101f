package systemd

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// JoinCodeCredential is the credential stratum-agent.service passes the join
// code under (LoadCredential=join-code:/etc/stratum/join-code).
const JoinCodeCredential = "join-code"

// Credential reads the credential name from $CREDENTIALS_DIRECTORY, without
// surrounding whitespace (a code file written with echo ends in a newline).
// ok is false, with no error, when the process has no credentials directory,
// the credential is missing, or it is empty after trimming: the agent unit's
// SetCredential= fallback for a deleted code file is a lone newline.
//
// The value may be a secret; it never appears in the returned error.
func Credential(name string) (value []byte, ok bool, err error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return nil, false, fmt.Errorf("credential name %q is not a file name", name)
	}
	dir := os.Getenv("CREDENTIALS_DIRECTORY")
	if dir == "" {
		return nil, false, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read credential %s: %w", name, err)
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, false, nil
	}
	return b, true, nil
}
