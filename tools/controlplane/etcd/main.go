// Command etcd runs the etcd server for the project's test control plane. etcd's own main
// cannot be installed at a version (its go.mod replaces sibling modules), so this wrapper
// calls the same entry point from the published module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
