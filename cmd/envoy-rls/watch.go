package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// watchConfig reloads the config on SIGHUP and, with --watch-config, when a
// file in the config's directory changes (writes, renames, and the symlink
// swaps of a Kubernetes ConfigMap). Bursts of events are folded into one
// reload. It returns a function that stops watching.
func watchConfig(ctx context.Context, o sourceOptions, log *slog.Logger, hup <-chan os.Signal, reload func(reason string)) func() {
	ctx, cancel := context.WithCancel(ctx)
	var events <-chan fsnotify.Event
	var watchErrs <-chan error
	var w *fsnotify.Watcher
	dir, file := configDir(o.Config), ""
	if dir != o.Config {
		file = o.Config
	}
	if o.WatchConfig && o.Config != "" {
		var err error
		w, err = fsnotify.NewWatcher()
		if err == nil {
			err = w.Add(dir)
			if err == nil && o.Load.ConfigRecursive {
				// The loader reads subdirectories: watch them too (the
				// reference sees changes of its directory only).
				watchSubdirs(w, dir, o.Load.descriptorOptions())
			}
			if err == nil && o.WatchRoot != "" {
				// The reference's RUNTIME_WATCH_ROOT: RUNTIME_ROOT itself
				// may be replaced (a symlink swapped), which only its
				// parent directory sees.
				err = w.Add(filepath.Dir(filepath.Clean(o.WatchRoot)))
			}
		}
		if err != nil {
			log.Warn("cannot watch the config; reload with SIGHUP", "error", err)
		} else {
			events, watchErrs = w.Events, w.Errors
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		var pendingSince time.Time // first event not yet reloaded
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				reload("SIGHUP")
			case ev, ok := <-events:
				if !ok {
					events = nil
					continue
				}
				if ev.Op == fsnotify.Chmod {
					continue
				}
				if o.WatchRoot != "" && filepath.Dir(ev.Name) == filepath.Dir(filepath.Clean(o.WatchRoot)) && ev.Name != filepath.Clean(o.WatchRoot) {
					continue // another entry next to the root
				}
				if !configEvent(dir, file, ev.Name, o.Load.descriptorOptions()) {
					continue // another file next to the config (a log, say)
				}
				// Quiet for reloadSettle, but never later than
				// reloadMaxDelay after the first event: a stream of events
				// cannot starve the reload.
				if pendingSince.IsZero() {
					pendingSince = time.Now()
				}
				timer.Reset(min(reloadSettle, max(reloadMaxDelay-time.Since(pendingSince), 0)))
			case err, ok := <-watchErrs:
				if !ok {
					watchErrs = nil
					continue
				}
				log.Warn("config watch error", "error", err)
			case <-timer.C:
				// A stable snapshot: the files read the same across a
				// settle time, so a writer that pauses mid-file is not
				// loaded half-written. If they changed, wait again.
				if !stableConfig(ctx, o.Config, o.Load.ConfigRecursive, reloadSettle) {
					timer.Reset(reloadSettle)
					continue
				}
				pendingSince = time.Time{}
				reload("file change")
				if w != nil && o.WatchRoot != "" {
					// After a root swap the config directory is a new
					// one: watch it by its path again.
					_ = w.Add(configDir(o.Config))
				}
				if w != nil && o.Load.ConfigRecursive {
					watchSubdirs(w, configDir(o.Config), o.Load.descriptorOptions()) // new ones too
				}
			}
		}
	}()
	return func() {
		cancel()
		if w != nil {
			w.Close()
		}
		wg.Wait()
	}
}

// configEvent reports whether a change of the entry name (as fsnotify names
// it) may change the config read from dir: file is the config's path when it
// is a file, "" when the config is the directory dir, which lo selects files
// from. Only such changes reload: a process that logs into a file next to
// its config would otherwise reload itself every settle interval for ever
// (each reload logs a line). Kubernetes' atomic writer entries (..data,
// ..data_tmp, ..TIMESTAMP) always count; then, for a file, its own name; for
// a directory, the entries the loader reads (*.yaml, *.yml, not dotfiles;
// any name with --config-all-files or --config-recursive, which reads
// subdirectories; dotfiles with --config-dotfiles). Names outside dir (the
// parent of --watch-root) are not judged here.
func configEvent(dir, file, name string, lo descriptors.Options) bool {
	name = filepath.Clean(name)
	if filepath.Dir(name) != filepath.Clean(dir) {
		return true
	}
	base := filepath.Base(name)
	switch {
	case strings.HasPrefix(base, ".."):
		return true
	case file != "":
		return name == filepath.Clean(file)
	case strings.HasPrefix(base, "."):
		return lo.Dotfiles
	case lo.AllFiles || lo.Recursive:
		return true
	}
	ext := filepath.Ext(base)
	return ext == ".yaml" || ext == ".yml"
}

// Reload timing: a change is reloaded once the config's files have been
// quiet for reloadSettle and read the same twice reloadSettle apart, and
// at the latest reloadMaxDelay after the first change when events keep
// coming (the stability check still applies).
const (
	reloadSettle   = 200 * time.Millisecond
	reloadMaxDelay = 2 * time.Second
)

// watchSubdirs adds a watch for every subdirectory of dir that the loader
// with lo reads (not through links to directories, not Kubernetes' ..
// entries, dot directories only with lo.Dotfiles). Adding a watched one
// again does nothing.
func watchSubdirs(w *fsnotify.Watcher, dir string, lo descriptors.Options) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || strings.HasPrefix(name, "..") || (!lo.Dotfiles && strings.HasPrefix(name, ".")) {
			continue
		}
		sub := filepath.Join(dir, name)
		_ = w.Add(sub)
		watchSubdirs(w, sub, lo)
	}
}

// configSnapshot returns the contents of the config's files (the file, or
// every regular file of the directory, by name, and of its subdirectories
// when recursive), or nil when unreadable.
func configSnapshot(path string, recursive bool) []byte {
	st, err := os.Stat(path)
	if err != nil {
		return nil
	}
	if !st.IsDir() {
		b, _ := os.ReadFile(path)
		return b
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil
	}
	var all []byte
	for _, e := range entries { // sorted by name
		if recursive && e.IsDir() {
			all = append(all, e.Name()...)
			all = append(all, '/')
			all = append(all, configSnapshot(filepath.Join(path, e.Name()), true)...)
			continue
		}
		b, err := os.ReadFile(filepath.Join(path, e.Name()))
		if err != nil {
			continue
		}
		all = append(all, e.Name()...)
		all = append(all, 0)
		all = append(all, b...)
		all = append(all, 0)
	}
	return all
}

// stableConfig reports whether the config's files read the same before and
// after settle.
func stableConfig(ctx context.Context, path string, recursive bool, settle time.Duration) bool {
	before := configSnapshot(path, recursive)
	t := time.NewTimer(settle)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	return bytes.Equal(before, configSnapshot(path, recursive))
}
