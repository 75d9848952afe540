package main

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// versionLine describes the binary: the version stamped with
// -ldflags "-X main.version=...", else the module version Go recorded (a
// tag, or a pseudo-version from the commit), then the VCS commit, its time
// and whether the tree was modified, and the Go version and platform.
func versionLine(stamped string, info *debug.BuildInfo) string {
	v := stamped
	if v == "" && info != nil && info.Main.Version != "" && info.Main.Version != "(devel)" {
		v = info.Main.Version
	}
	if v == "" {
		v = "devel"
	}
	var details []string
	var rev, when string
	modified := false
	if info != nil {
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	switch {
	case rev != "":
		if len(rev) > 12 {
			rev = rev[:12]
		}
		c := "commit " + rev
		if modified {
			c += " with local changes"
		}
		details = append(details, c)
		if when != "" {
			details = append(details, when)
		}
	}
	goVersion := runtime.Version()
	if info != nil && info.GoVersion != "" {
		goVersion = info.GoVersion
	}
	details = append(details, goVersion+" "+runtime.GOOS+"/"+runtime.GOARCH)
	line := "envoy-rls " + v + " (" + strings.Join(details, ", ") + ")"
	if v == "devel" && rev == "" {
		line += "\nno version or VCS information: built by go run, with -buildvcs=false or outside a git checkout (make build records the commit)"
	}
	return line
}
