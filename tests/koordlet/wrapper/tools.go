//go:build tools

// Package tools keeps koordlet's main package (and so its whole module graph)
// in this wrapper module's go.mod through `go mod tidy`; build.sh builds
// github.com/koordinator-sh/koordinator/cmd/koordlet from it.
package tools

import (
	_ "github.com/koordinator-sh/koordinator/cmd/koordlet"
)
