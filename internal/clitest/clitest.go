// Package clitest holds what the command lines' testscript suites share:
// custom script commands that start and wait for a real listener, and
// read values out of a command's JSON output.
package clitest

import (
	"encoding/json"
	"errors"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
)

// Cmds are the custom script commands:
//
//	freeport NAME         set $NAME to a free loopback UDP host:port
//	waitsocket PATH       wait (up to a minute) until a unix socket at PATH accepts
//	jsonenv NAME FIELD    set $NAME to top-level FIELD of the last command's stdout
//	status N PROG ARGS... run PROG and insist on exit status N (stdout and stderr kept for the next lines)
func Cmds() map[string]func(ts *testscript.TestScript, neg bool, args []string) {
	return map[string]func(*testscript.TestScript, bool, []string){
		"freeport":   freeport,
		"waitsocket": waitsocket,
		"jsonenv":    jsonenv,
		"status":     status,
	}
}

func freeport(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: freeport NAME")
	}
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	ts.Check(err)
	addr := c.LocalAddr().String()
	ts.Check(c.Close())
	ts.Setenv(args[0], addr)
}

// waitsocket polls for a positive outcome (a connection accepted); the
// minute only bounds the wait on a loaded machine.
func waitsocket(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitsocket PATH")
	}
	path := ts.MkAbs(args[0])
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := net.Dial("unix", path)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("%s never accepted: %v", path, err)
		}
		time.Sleep(20 * time.Millisecond) // polling for the positive condition above
	}
}

func jsonenv(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: jsonenv NAME FIELD")
	}
	var v map[string]any
	ts.Check(json.Unmarshal([]byte(ts.ReadFile("stdout")), &v))
	f, ok := v[args[1]]
	if !ok {
		ts.Fatalf("no field %q in stdout", args[1])
	}
	s, ok := f.(string)
	if !ok {
		b, err := json.Marshal(f)
		ts.Check(err)
		s = strings.TrimSpace(string(b))
	}
	ts.Setenv(args[0], s)
}

func status(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: status N PROG ARGS...")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	got := 0
	if err := ts.Exec(args[1], args[2:]...); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			ts.Fatalf("%s: %v", args[1], err)
		}
		got = ee.ExitCode()
	}
	if got != want {
		ts.Fatalf("%s exited %d, want %d", args[1], got, want)
	}
}
