package cli

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
)

func TestExitCode(t *testing.T) {
	cause := errors.New("cause")
	err := fmt.Errorf("outer: %w", Usage(cause))
	code, ok := ExitCode(err)
	if !ok || code != ExitUsage {
		t.Fatalf("ExitCode = %d, %v; want %d, true", code, ok, ExitUsage)
	}
	if !errors.Is(err, cause) {
		t.Fatal("the cause is not in the chain")
	}
	if err.Error() != "outer: cause" {
		t.Fatalf("Error() = %q", err.Error())
	}
	if _, ok := ExitCode(cause); ok {
		t.Fatal("a plain error carries an exit status")
	}
}

func TestPrintJSON(t *testing.T) {
	var b bytes.Buffer
	if err := PrintJSON(&b, map[string]int{"a": 1}); err != nil {
		t.Fatal(err)
	}
	if want := "{\n  \"a\": 1\n}\n"; b.String() != want {
		t.Fatalf("PrintJSON wrote %q, want %q", b.String(), want)
	}
}
