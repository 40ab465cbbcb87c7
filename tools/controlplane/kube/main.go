// Command kube is a multicall binary for the project's test control plane: it serves
// kube-apiserver, kube-controller-manager, kube-scheduler or kubelet (the simulator's real node), chosen by the first argument
// (or by the name it is invoked as). Built only for tests and the simulator.
package main

import (
	"context"

	"github.com/spf13/cobra"

	"gpu-operator.local/controlplane/multicall"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	multicall.Main(map[string]func() *cobra.Command{
		"kube-apiserver":          apiserver.NewAPIServerCommand,
		"kube-controller-manager": func() *cobra.Command { return controllermanager.NewControllerManagerCommand() },
		"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
		"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
	})
}
