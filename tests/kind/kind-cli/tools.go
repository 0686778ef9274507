//go:build tools

// Keeps sigs.k8s.io/kind (its main package is the module root) in go.mod
// through `go mod tidy`; tests/kind/build.sh builds it from this module.
package tools

import (
	_ "sigs.k8s.io/kind"
)
