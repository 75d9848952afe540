package main

import (
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
// swaps of a Kubernetes ConfigMap). Events are folded into one reload on
// the schedule of a reloadPlan: an atomic replacement within reloadMaxDelay
// however many keep coming, a file written in place only once it has been
// left alone for --config-reload-hold. It returns a function that stops
// watching.
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
	plan := newReloadPlan(o.ReloadHold)
	// relevant reports whether ev may change the config.
	relevant := func(ev fsnotify.Event) bool {
		if ev.Op == fsnotify.Chmod {
			return false
		}
		if o.WatchRoot != "" && filepath.Dir(ev.Name) == filepath.Dir(filepath.Clean(o.WatchRoot)) && ev.Name != filepath.Clean(o.WatchRoot) {
			return false // another entry next to the root
		}
		// Not another file next to the config (a log, say).
		return configEvent(dir, file, ev.Name, o.Load.descriptorOptions())
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		// schedule sets the timer to the plan's next reload.
		schedule := func() {
			if due, ok := plan.due(time.Now(), modTime); ok {
				timer.Reset(max(time.Until(due), 0))
			}
		}
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
				if relevant(ev) {
					plan.event(ev, time.Now())
					schedule()
				}
			case err, ok := <-watchErrs:
				if !ok {
					watchErrs = nil
					continue
				}
				// Events may have been lost (the kernel's queue
				// overflowed): any file may be half written.
				log.Warn("config watch error; reloading once the files have been left alone for --config-reload-hold", "error", err)
				plan.unknown(time.Now())
				schedule()
			case <-timer.C:
				// Take the events already delivered first: a write seen
				// now postpones the reload.
				for drained := false; !drained; {
					select {
					case ev, ok := <-events:
						if !ok {
							events, drained = nil, true
						} else if relevant(ev) {
							plan.event(ev, time.Now())
						}
					default:
						drained = true
					}
				}
				now := time.Now()
				if due, ok := plan.due(now, modTime); !ok {
					continue
				} else if due.After(now) {
					timer.Reset(due.Sub(now))
					continue
				}
				plan.reset()
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
