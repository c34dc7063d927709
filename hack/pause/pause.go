// pause: the sandbox's first process for the local real node. It holds the pod's namespaces,
// reaps the orphans it inherits as PID 1, and exits on SIGINT or SIGTERM. Built static by
// hack/build-node.sh (CGO disabled) so the pause image needs no libc.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
