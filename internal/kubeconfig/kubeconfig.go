// Package kubeconfig finds Kubernetes credentials the way kubectl does.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Load uses path if given, then $KUBECONFIG and ~/.kube/config, then the
// in-cluster service account.
func Load(path string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes credentials: %w", err)
	}
	return cfg, nil
}
