//go:build tools

// Keeps helm's command in go.mod/go.sum through `go mod tidy`; build.sh builds
// helm.sh/helm/v3/cmd/helm from this module, so the pinned go.sum decides every
// dependency.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
