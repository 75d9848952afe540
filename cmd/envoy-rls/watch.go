package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watchConfig reloads the config on SIGHUP and, with --watch-config, when a
// file in the config's directory changes (writes, renames, and the symlink
// swaps of a Kubernetes ConfigMap). Bursts of events are folded into one
// reload. It returns a function that stops watching.
func watchConfig(ctx context.Context, o options, log *slog.Logger, hup <-chan os.Signal, reload func(reason string)) func() {
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
				if !configEvent(dir, file, ev.Name) {
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
				if !stableConfig(ctx, o.Config, reloadSettle) {
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
