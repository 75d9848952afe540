package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

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

// TestReloadPlan: an atomic replacement reloads within reloadMaxDelay
// however many keep coming; a file written in place holds the reload until
// it has been left alone for the hold, by its events and by its
// modification time; a file renamed away or replaced holds nothing.
func TestReloadPlan(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.yaml")
	empty := filepath.Join(dir, "new.yaml")
	if err := os.WriteFile(a, []byte("domain: a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	const hold = 2 * time.Second
	t0 := time.Unix(1_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	mtimes := map[string]time.Time{}
	mtime := func(name string) (time.Time, bool) {
		mt, ok := mtimes[name]
		return mt, ok
	}
	ev := func(name string, op fsnotify.Op) fsnotify.Event { return fsnotify.Event{Name: name, Op: op} }
	want := func(p *reloadPlan, now time.Time, due time.Duration) {
		t.Helper()
		got, ok := p.due(now, mtime)
		if !ok || !got.Equal(at(due)) {
			t.Errorf("at %v: due %v (%v), want %v", now.Sub(t0), got.Sub(t0), ok, due)
		}
	}

	p := newReloadPlan(hold)
	if _, ok := p.due(t0, mtime); ok {
		t.Fatal("due with no change")
	}
	// An atomic storm: a rename every 10 ms for 5 s. Due 2 s after the
	// first, not 200 ms after the last.
	for d := time.Duration(0); d < 5*time.Second; d += 10 * time.Millisecond {
		p.event(ev(a, fsnotify.Create), at(d))
		if d < reloadMaxDelay-reloadSettle {
			want(p, at(d), d+reloadSettle)
		} else {
			want(p, at(d), reloadMaxDelay)
		}
	}
	p.reset()
	// A quiet one: 200 ms after.
	p.event(ev(filepath.Join(dir, "..data"), fsnotify.Create), at(0))
	want(p, at(0), reloadSettle)
	p.reset()

	// In place: the hold after the last write, whatever the storm beside.
	mtimes[a] = at(0)
	p.event(ev(a, fsnotify.Write), at(0))
	want(p, at(0), hold)
	p.event(ev(filepath.Join(dir, "b.yaml"), fsnotify.Create), at(100*time.Millisecond))
	p.event(ev(a, fsnotify.Write), at(900*time.Millisecond)) // the writer paused 900 ms
	mtimes[a] = at(900 * time.Millisecond)
	want(p, at(time.Second), 900*time.Millisecond+hold)
	// A write whose event is not here yet moved the modification time.
	mtimes[a] = at(1500 * time.Millisecond)
	want(p, at(1600*time.Millisecond), 1500*time.Millisecond+hold)
	// A modification time in the future is not waited for.
	mtimes[a] = at(time.Hour)
	want(p, at(1600*time.Millisecond), 900*time.Millisecond+hold)
	mtimes[a] = at(1500 * time.Millisecond)
	// Renamed over: the new file is whole.
	p.event(ev(a, fsnotify.Create), at(1700*time.Millisecond))
	want(p, at(1700*time.Millisecond), 1700*time.Millisecond+reloadSettle)
	p.reset()

	// Written in place, then renamed away (a temporary file that counts
	// as config, renamed onto another name): it holds nothing.
	tmp := filepath.Join(dir, "tmp.yaml")
	mtimes[tmp] = at(0)
	p.event(ev(tmp, fsnotify.Write), at(0))
	p.event(ev(tmp, fsnotify.Rename), at(10*time.Millisecond))
	want(p, at(10*time.Millisecond), 10*time.Millisecond+reloadSettle)
	p.reset()
	// A file gone by the time it is judged holds nothing either.
	p.event(ev(filepath.Join(dir, "gone.yaml"), fsnotify.Write), at(0))
	want(p, at(0), reloadSettle)
	p.reset()

	// A new empty file: its writer may pause before its first write.
	mtimes[empty] = at(0)
	p.event(ev(empty, fsnotify.Create), at(0))
	want(p, at(0), hold)
	p.reset()

	// Events lost: the hold for everything.
	p.unknown(at(0))
	want(p, at(0), hold)
	p.reset()
	if _, ok := p.due(t0, mtime); ok {
		t.Fatal("due after reset")
	}
}
