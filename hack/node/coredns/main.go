// Cluster DNS for the test node (tests/fixtures/node.py): CoreDNS with only the plugins its Corefile uses, so the
// setup compiles a fraction of CoreDNS's dependencies (its cloud DNS providers above all). No registry is reachable
// here, so its image cannot be pulled; the fixture runs this binary beside the kubelet.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/kubernetes"

	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
