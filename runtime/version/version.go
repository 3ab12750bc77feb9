// Package version holds the build's version, set by the linker.
package version

// Version is set with -ldflags "-X .../runtime/version.Version=...".
var Version = "0.1.0-dev"

// Commit is set with -ldflags "-X .../runtime/version.Commit=...".
var Commit = "unknown"
