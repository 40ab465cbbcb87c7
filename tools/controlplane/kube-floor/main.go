// Command kube is the control plane of the oldest Kubernetes the project supports (version.env,
// KUBE_FLOOR_VERSION): kube-apiserver, kube-controller-manager or kube-scheduler, chosen by the
// first argument or the name it is invoked as. Nodes are kwok's, so no kubelet. Built only for
// tests and the simulator.
package main

import (
	"github.com/spf13/cobra"

	"gpu-operator.local/controlplane/multicall"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	multicall.Main(map[string]func() *cobra.Command{
		"kube-apiserver":          apiserver.NewAPIServerCommand,
		"kube-controller-manager": controllermanager.NewControllerManagerCommand,
		"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	})
}
