package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// TestConfigEvent: only changes that can change the config reload it. A log
// file written next to a single config file made the service reload itself
// every 200 ms for ever (each reload logged a line into that file).
func TestConfigEvent(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "ratelimit.yaml")
	if err := os.WriteFile(file, []byte("domain: d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "conf.d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fileDir, fileFile := configDir(file), ""
	if fileDir != file {
		fileFile = file
	}
	if fileDir != root || fileFile != file {
		t.Fatalf("configDir(%q) = %q, want %q", file, fileDir, root)
	}
	for _, c := range []struct {
		dir, file, name string
		want            bool
		lo              descriptors.Options
	}{
		// A single config file.
		{root, file, file, true, descriptors.Options{}},
		{root, file, filepath.Join(root, "rls.log"), false, descriptors.Options{}},
		{root, file, filepath.Join(root, "other.yaml"), false, descriptors.Options{}},
		{root, file, filepath.Join(root, ".ratelimit.yaml.swp"), false, descriptors.Options{}},
		{root, file, filepath.Join(root, "..data"), true, descriptors.Options{}}, // ConfigMap swap
		{root, file, filepath.Join(root, "..data_tmp"), true, descriptors.Options{}},
		{root, file, filepath.Join(filepath.Dir(root), "current"), true, descriptors.Options{}}, // --watch-root's parent: judged elsewhere
		// A config directory.
		{dir, "", filepath.Join(dir, "a.yaml"), true, descriptors.Options{}},
		{dir, "", filepath.Join(dir, "b.yml"), true, descriptors.Options{}},
		{dir, "", filepath.Join(dir, "..2026_12_01_02_00_00.123"), true, descriptors.Options{}},
		{dir, "", filepath.Join(dir, "rls.log"), false, descriptors.Options{}},
		{dir, "", filepath.Join(dir, ".a.yaml"), false, descriptors.Options{}},
		{dir, "", filepath.Join(dir, "a.yaml~"), false, descriptors.Options{}},
		// As the reference reads a directory: every file, subdirectories,
		// dotfiles when asked.
		{dir, "", filepath.Join(dir, "ratelimit-config"), true, descriptors.Options{AllFiles: true}},
		{dir, "", filepath.Join(dir, "team-a"), true, descriptors.Options{Recursive: true}},
		{dir, "", filepath.Join(dir, ".a.yaml"), false, descriptors.Options{AllFiles: true, Recursive: true}},
		{dir, "", filepath.Join(dir, ".a.yaml"), true, descriptors.Options{Dotfiles: true}},
		{dir, "", filepath.Join(dir, "..data"), true, descriptors.Options{AllFiles: true}},
		{root, file, filepath.Join(root, "rls.log"), false, descriptors.Options{AllFiles: true, Recursive: true, Dotfiles: true}},
	} {
		if got := configEvent(c.dir, c.file, c.name, c.lo); got != c.want {
			t.Errorf("configEvent(%q, %q, %q, %+v) = %v, want %v", c.dir, c.file, c.name, c.lo, got, c.want)
		}
	}
	// Relative paths as fsnotify names them (the watched path joined with
	// the entry's name).
	if !configEvent(".", "./ratelimit.yaml", "ratelimit.yaml", descriptors.Options{}) {
		t.Error("a relative config file's own event was not a config event")
	}
	if configEvent(".", "./ratelimit.yaml", "rls.log", descriptors.Options{}) {
		t.Error("a log next to a relative config file was a config event")
	}
}
