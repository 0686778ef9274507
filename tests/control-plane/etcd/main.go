// Command etcd is the upstream etcd server main (go.etcd.io/etcd/server/v3),
// built from the Go module proxy for Headroom's integration tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
