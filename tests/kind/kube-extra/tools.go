//go:build tools

// The two Kubernetes commands a kind node needs beyond what
// tests/control-plane/kube-node builds: kubeadm (creates the cluster) and
// kube-proxy (the kubernetes Service inside the cluster). Built by
// tests/kind/build.sh from this module.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
