package adminapi

import (
	"errors"
	"io"
	"net/http"

	"github.com/stratumjoin/stratum/internal/strictjson"
)

// decodeStrict decodes exactly one JSON value from r into v through
// strictjson: member names match exactly, duplicate and unknown members,
// a second value or trailing garbage, and a body over maxBody are errors.
// The error names the member at fault by its path (expect.serial, tags[0]).
func decodeStrict(r io.Reader, v any) *apiError {
	b, err := io.ReadAll(r)
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return errInvalid("the body is larger than 1 MiB")
	}
	if err != nil {
		return errInvalid("the body could not be read")
	}
	if err := strictjson.Unmarshal(b, v); err != nil {
		return decodeError(err)
	}
	return nil
}

func decodeError(err error) *apiError {
	var e *strictjson.Error
	if !errors.As(err, &e) {
		return errInvalid("the body is not valid JSON")
	}
	switch e.Kind {
	case strictjson.Empty:
		return errInvalid("a JSON body is required")
	case strictjson.Syntax:
		return errInvalid("the body must hold one JSON object and nothing after it")
	case strictjson.Duplicate:
		return errInvalid("the request has invalid fields", fieldError{path: e.Path, msg: "is given more than once"})
	case strictjson.Unknown:
		return errInvalid("the request has invalid fields", fieldError{path: e.Path, msg: "is not a field of this request (names match exactly)"})
	}
	if e.Path == "" {
		return errInvalid("the body must be a JSON object")
	}
	return errInvalid("the request has invalid fields", fieldError{path: e.Path, msg: "must be " + e.Want})
}
