package cli

import (
	"encoding/json"
	"errors"
	"io"
)

// ExitError is an error that carries its exit status.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// Exit wraps err with the exit status code.
func Exit(code int, err error) error { return &ExitError{Code: code, Err: err} }

// Usage wraps err as a usage error (ExitUsage).
func Usage(err error) error { return Exit(ExitUsage, err) }

// ExitCode is the status an ExitError in err's chain carries, and ok
// false where there is none (the caller then maps err by its cause).
func ExitCode(err error) (code int, ok bool) {
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code, true
	}
	return 0, false
}

// PrintJSON is every --json output of both binaries: one value, indented
// by two spaces, with a trailing newline.
func PrintJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
