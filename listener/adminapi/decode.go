package adminapi

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
)

// decodeStrict decodes exactly one JSON value from r into v: unknown
// fields, a second value or trailing garbage, and a body over maxBody are
// errors. The error names the field at fault where it can.
func decodeStrict(r io.Reader, v any) *apiError {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errInvalid("the body must hold one JSON object and nothing after it")
	}
	return nil
}

func decodeError(err error) *apiError {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	var tooBig *http.MaxBytesError
	switch {
	case errors.Is(err, io.EOF):
		return errInvalid("a JSON body is required")
	case errors.As(err, &tooBig):
		return errInvalid("the body is larger than 1 MiB")
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return errInvalid("the body must be a JSON object")
		}
		return errInvalid("the request has invalid fields", fieldError{path: typeErr.Field, msg: "must be " + jsonTypeName(typeErr.Type.Kind().String())})
	case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF):
		return errInvalid("the body is not valid JSON")
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		return errInvalid("the request has invalid fields", fieldError{path: name, msg: "is not a field of this request"})
	}
	return errInvalid("the body is not valid JSON")
}

func jsonTypeName(goKind string) string {
	switch goKind {
	case "int", "int64", "float64":
		return "an integer"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice":
		return "an array"
	case "struct", "map", "ptr":
		return "an object"
	}
	return "of another type"
}
