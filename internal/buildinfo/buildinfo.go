// Package buildinfo tells what a sealbridge binary was built from, for --version.
package buildinfo

import (
	"runtime/debug"
)

// Version returns "<module version> rev <12 hex>[+dirty] <go version>", from the build
// information the Go toolchain embeds; parts it does not know are left out.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown version)"
	}
	return format(bi)
}

func format(bi *debug.BuildInfo) string {
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if modified == "true" {
			rev += "+dirty"
		}
		v += " rev " + rev
	}
	return v + " " + bi.GoVersion
}
