// Command etcd is etcd's own server entry point, built from its Go module because
// etcd's server/go.mod carries replace directives that forbid `go install ...@version`.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
