// The pod sandbox's process (the "pause" container every pod of the test node holds its namespaces with). No
// registry is reachable here, so registry.k8s.io/pause cannot be pulled: this is its job in a static binary
// the setup builds into a one-file image. PID 1 of the sandbox: it reaps children that are reparented to it
// and exits on SIGINT/SIGTERM, as the real pause does.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
