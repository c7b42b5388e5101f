// Package strictjson is the one JSON decoder for untrusted input: admin
// API requests and the registry file. Member names match exactly (no
// case folding), and duplicate or unknown members are errors that name the
// member's path, so `{"poolId":"a","POOLID":"b"}` can never create in pool
// b. It sits on github.com/go-json-experiment/json, a kept library, rather
// than on a hand-written scanner.
package strictjson

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Problem kinds an Error carries.
const (
	Duplicate = "duplicate" // a member given twice
	Unknown   = "unknown"   // a member the target does not have
	Type      = "type"      // a value of the wrong JSON type
	Syntax    = "syntax"    // not JSON, or more than one value
	Empty     = "empty"     // no value at all
)

// Error is a decoding failure with the path of the member at fault, in the
// form the APIs report it: `expect.hostname`, `tags[0]`; empty for the
// whole document.
type Error struct {
	Kind string
	Path string
	// Want names the JSON type expected, for Type errors.
	Want string
	err  error
}

func (e *Error) Error() string {
	switch e.Kind {
	case Duplicate:
		return fmt.Sprintf("member %s is given more than once", e.Path)
	case Unknown:
		return fmt.Sprintf("member %s is not known (names match exactly)", e.Path)
	case Type:
		if e.Path == "" {
			return "the document must be " + e.Want
		}
		return fmt.Sprintf("member %s must be %s", e.Path, e.Want)
	case Empty:
		return "the document is empty"
	}
	return "the document is not valid JSON"
}

func (e *Error) Unwrap() error { return e.err }

// Decode reads exactly one JSON value from r into v.
func Decode(r io.Reader, v any) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	return Unmarshal(b, v)
}

// Unmarshal decodes exactly one JSON value from b into v.
func Unmarshal(b []byte, v any) error {
	if len(strings.TrimSpace(string(b))) == 0 {
		return &Error{Kind: Empty}
	}
	err := json.Unmarshal(b, v, json.RejectUnknownMembers(true), jsontext.AllowDuplicateNames(false))
	if err == nil {
		return nil
	}
	return classify(err)
}

func classify(err error) error {
	var syn *jsontext.SyntacticError
	var sem *json.SemanticError
	switch {
	case errors.As(err, &syn):
		if errors.Is(syn.Err, jsontext.ErrDuplicateName) {
			return &Error{Kind: Duplicate, Path: Path(syn.JSONPointer), err: err}
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return &Error{Kind: Syntax, err: err}
		}
		return &Error{Kind: Syntax, err: err}
	case errors.As(err, &sem):
		if errors.Is(sem.Err, json.ErrUnknownName) {
			return &Error{Kind: Unknown, Path: Path(sem.JSONPointer), err: err}
		}
		return &Error{Kind: Type, Path: Path(sem.JSONPointer), Want: typeName(sem), err: err}
	}
	return &Error{Kind: Syntax, err: err}
}

// Path turns a JSON pointer (/expect/hostname, /tags/0) into the dotted
// form the APIs use (expect.hostname, tags[0]).
func Path(p jsontext.Pointer) string {
	var b strings.Builder
	for tok := range p.Tokens() {
		if tok != "" && strings.Trim(tok, "0123456789") == "" {
			b.WriteString("[" + tok + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	return b.String()
}

func typeName(sem *json.SemanticError) string {
	if sem.GoType == nil {
		return "of another type"
	}
	switch sem.GoType.Kind().String() {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer"
	case "float32", "float64":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice", "array":
		return "an array"
	case "struct", "map":
		return "an object"
	case "ptr":
		return "a value of " + sem.GoType.Elem().Kind().String() + " type"
	}
	return "of another type"
}
