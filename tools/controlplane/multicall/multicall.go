// Package multicall runs one of several Kubernetes components from a single binary, chosen by
// the name the binary is invoked as or by its first argument. The test control plane's binaries
// (../kube for the current Kubernetes, ../kube-floor for the oldest we support) are built on it.
package multicall

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
)

// Main runs the component named by argv[0]'s base name or, failing that, by argv[1], and exits
// with its status; an unknown or missing name prints the choices and exits 2.
func Main(commands map[string]func() *cobra.Command) {
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	choices := strings.Join(names, "|")
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if _, ok := commands[name]; !ok {
		if len(args) == 0 {
			fmt.Fprintf(os.Stderr, "usage: %s {%s} [flags]\n", name, choices)
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	newCommand, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown component %q: expected one of %s\n", name, choices)
		os.Exit(2)
	}
	command := newCommand()
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}
