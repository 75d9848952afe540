package main

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestVersionLine(t *testing.T) {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	const noVCS = "no version or VCS information: built by go run, with -buildvcs=false or outside a git checkout (make build records the commit)"
	vcs := []debug.BuildSetting{
		{Key: "-buildmode", Value: "exe"},
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
		{Key: "vcs.time", Value: "2026-12-01T00:31:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}
	for _, tc := range []struct {
		name    string
		stamped string
		info    *debug.BuildInfo
		want    string
	}{
		{"go run", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			"envoy-rls devel (go1.26.8 " + platform + ")\n" + noVCS},
		{"go build in a checkout", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261201003100-0123456789ab+dirty"}, Settings: vcs},
			"envoy-rls v0.0.0-20261201003100-0123456789ab+dirty (commit 0123456789ab with local changes, 2026-12-01T00:31:00Z, go1.26.8 " + platform + ")"},
		{"ldflags", "1.4.0", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			"envoy-rls 1.4.0 (go1.26.8 " + platform + ")"},
		{"ldflags and vcs", "1.4.0", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.3.0"}, Settings: vcs[:4]},
			"envoy-rls 1.4.0 (commit 0123456789ab, 2026-12-01T00:31:00Z, go1.26.8 " + platform + ")"},
		{"go install at a tag", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.3.0"}},
			"envoy-rls v1.3.0 (go1.26.8 " + platform + ")"},
		{"no build info", "", nil,
			"envoy-rls devel (" + runtime.Version() + " " + platform + ")\n" + noVCS},
	} {
		if got := versionLine(tc.stamped, tc.info); got != tc.want {
			t.Errorf("%s:\n got  %s\n want %s", tc.name, got, tc.want)
		}
	}
}
