// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3 in a module of its
// own so that its dependency graph never mixes with the Kubernetes one.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
