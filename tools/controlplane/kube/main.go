// Command kube is a multicall binary for the project's test control plane: it serves
// kube-apiserver, kube-controller-manager, kube-scheduler or kubelet (the simulator's real node), chosen by the first argument
// (or by the name it is invoked as). Built only for tests and the simulator.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"

	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	commands := map[string]func() *cobra.Command{
		"kube-apiserver":          apiserver.NewAPIServerCommand,
		"kube-controller-manager": func() *cobra.Command { return controllermanager.NewControllerManagerCommand() },
		"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
		"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
	}
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if _, ok := commands[name]; !ok {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, "usage: kube {kube-apiserver|kube-controller-manager|kube-scheduler|kubelet} [flags]")
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	newCommand, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown component %q: expected kube-apiserver, kube-controller-manager, kube-scheduler or kubelet\n", name)
		os.Exit(2)
	}
	command := newCommand()
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}
