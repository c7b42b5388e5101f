// Command etcdmain is etcd itself, built from its Go module, so tests can run
// etcd members as real processes (to kill them, cut their peer traffic and
// lose quorum) without a system package.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
