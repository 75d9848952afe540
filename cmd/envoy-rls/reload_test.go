package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/schedprobe"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// versionConfig is version v of a config: two descriptors, a and b, both
// limited to v an hour. cut is where a writer that pauses mid-file stops
// first: after a, so that the part alone is a valid config that limits b
// not at all, what a truncated file served.
func versionConfig(v int) (full string, cut int) {
	a := fmt.Sprintf("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", v)
	b := fmt.Sprintf("  - key: b\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", v)
	return a + b, len(a)
}

// loadedVersion returns the version of a config of versionConfig, and
// whether it is whole (b limited as a is).
func loadedVersion(cfg *descriptors.Config) (v int, whole bool) {
	limits := map[string]int{}
	cfg.Walk(func(_ *descriptors.Domain, n *descriptors.Node) {
		if len(n.Limits) == 1 {
			limits[n.Key] = int(n.Limits[0].RequestsPerUnit)
		}
	})
	b, ok := limits["b"]
	return limits["a"], ok && b == limits["a"]
}

// load is one reload the watcher asked for.
type load struct {
	start, end time.Time
	version    int
	whole      bool
	err        error
}

// watchLoads runs watchConfig on path with hold and records every reload
// it asks for.
func watchLoads(t *testing.T, path string, hold time.Duration) (loads func() []load) {
	t.Helper()
	var (
		mu  sync.Mutex
		all []load
	)
	o := sourceOptions{Config: path, WatchConfig: true, ReloadHold: hold}
	stop := watchConfig(context.Background(), o, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, func(string) {
		l := load{start: time.Now()}
		cfg, err := descriptors.LoadWith(path, o.Load.descriptorOptions())
		l.end, l.err = time.Now(), err
		if err == nil {
			l.version, l.whole = loadedVersion(cfg)
		}
		mu.Lock()
		all = append(all, l)
		mu.Unlock()
	})
	t.Cleanup(stop)
	return func() []load {
		mu.Lock()
		defer mu.Unlock()
		return append([]load(nil), all...)
	}
}

// TestAtomicReplacementsApplyDuringAStorm: a config replaced atomically
// 100 times a second with different content, by a rename over the file and
// by a ConfigMap's ..data symlink swap, is reloaded during the storm at
// most reloadMaxDelay after the reload before (plus the longest pause of
// the writer and the measured scheduling delay), every load whole and no
// older than the one before; after the storm the last version loads. Before,
// no reload happened until the storm ended.
func TestAtomicReplacementsApplyDuringAStorm(t *testing.T) {
	for _, layout := range []string{"rename", "configmap"} {
		t.Run(layout, func(t *testing.T) {
			dir := t.TempDir()
			var write func(v int) error
			switch layout {
			case "rename":
				write = func(v int) error {
					full, _ := versionConfig(v)
					tmp := filepath.Join(dir, ".limits.yaml.tmp")
					if err := os.WriteFile(tmp, []byte(full), 0o644); err != nil {
						return err
					}
					return os.Rename(tmp, filepath.Join(dir, "limits.yaml"))
				}
			case "configmap":
				// As the kubelet's atomic writer: a new ..<version>
				// directory, ..data_tmp pointing at it renamed over ..data,
				// the old directory removed; limits.yaml -> ..data/limits.yaml.
				write = func(v int) error {
					full, _ := versionConfig(v)
					ts := fmt.Sprintf("..v%06d", v)
					if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
						return err
					}
					if err := os.WriteFile(filepath.Join(dir, ts, "limits.yaml"), []byte(full), 0o644); err != nil {
						return err
					}
					old, _ := os.Readlink(filepath.Join(dir, "..data"))
					tmp := filepath.Join(dir, "..data_tmp")
					if err := os.Symlink(ts, tmp); err != nil {
						return err
					}
					if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
						return err
					}
					if old != "" {
						return os.RemoveAll(filepath.Join(dir, old))
					}
					return nil
				}
			}
			if err := write(1); err != nil {
				t.Fatal(err)
			}
			if layout == "configmap" {
				if err := os.Symlink("..data/limits.yaml", filepath.Join(dir, "limits.yaml")); err != nil {
					t.Fatal(err)
				}
			}
			loads := watchLoads(t, dir, defaultReloadHold)

			probe := schedprobe.Start()
			const storm = 3 * reloadMaxDelay
			start := time.Now()
			v, writerGap, last := 1, time.Duration(0), start
			for time.Since(start) < storm {
				time.Sleep(10 * time.Millisecond) // the writer's pace (what is tested, not a wait)
				v++
				if err := write(v); err != nil {
					t.Fatal(err)
				}
				now := time.Now()
				writerGap, last = max(writerGap, now.Sub(last)), now
			}
			end := time.Now()
			final := v
			testutil.WaitFor(t, 20*time.Second, "the last version loaded", func() bool {
				l := loads()
				return len(l) > 0 && l[len(l)-1].version == final
			})
			bound := probe.Stop()

			all := loads()
			prev, during := start, 0
			for i, l := range all {
				if l.err != nil || !l.whole {
					t.Errorf("load %d: version %d whole=%v err=%v: an atomic replacement was loaded in part", i, l.version, l.whole, l.err)
				}
				if i > 0 && l.version < all[i-1].version {
					t.Errorf("load %d: version %d after %d", i, l.version, all[i-1].version)
				}
				if l.start.After(end) {
					break
				}
				during++
				if gap := l.start.Sub(prev); gap > reloadMaxDelay+writerGap+bound {
					t.Errorf("load %d began %v after the reload before (or the storm's start), more than %v + the writer's longest pause %v + the measured scheduling delay %v", i, gap, reloadMaxDelay, writerGap, bound)
				}
				prev = l.end
			}
			if gap := end.Sub(prev); gap > reloadMaxDelay+writerGap+bound {
				t.Errorf("no reload in the last %v of the storm (more than %v + %v + %v)", gap, reloadMaxDelay, writerGap, bound)
			}
			t.Logf("%d versions in %v; %d reloads during the storm, %d in all; writer's longest pause %v, scheduling bound %v", final, end.Sub(start).Round(time.Millisecond), during, len(all), writerGap, bound)
		})
	}
}

// TestInPlaceWritesWaitForTheHold: a file rewritten in place again and
// again with different content, each time by a writer that pauses 450 to
// 900 ms mid-file (the part alone a valid config without b's limit), is
// never loaded in part: no reload happens while the writes go on, and the
// last version loads once the file has been left alone for the hold. Before,
// 8.4 % of answers during such writes had no limit.
func TestInPlaceWritesWaitForTheHold(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.yaml")
	full, _ := versionConfig(1)
	if err := os.WriteFile(path, []byte(full), 0o644); err != nil {
		t.Fatal(err)
	}
	loads := watchLoads(t, dir, defaultReloadHold)
	probe := schedprobe.Start()
	pauses := []time.Duration{450 * time.Millisecond, 900 * time.Millisecond, 600 * time.Millisecond, 750 * time.Millisecond, 500 * time.Millisecond}
	var longest time.Duration
	var last time.Time
	for i, pause := range pauses {
		full, cut := versionConfig(i + 2)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(full[:cut]); err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		time.Sleep(pause) // the writer pauses mid-file (what is tested, not a wait)
		if _, err := f.WriteString(full[cut:]); err != nil {
			t.Fatal(err)
		}
		last = time.Now()
		longest = max(longest, last.Sub(before))
		f.Close()
	}
	final := len(pauses) + 1
	testutil.WaitFor(t, 30*time.Second, "the last version loaded", func() bool {
		l := loads()
		return len(l) > 0 && l[len(l)-1].version == final
	})
	bound := probe.Stop()
	if longest >= defaultReloadHold {
		// The machine stretched a pause past the hold: a part may then
		// load, as documented. Nothing else here can be judged.
		t.Logf("a pause took %v, not shorter than the hold %v", longest, defaultReloadHold)
	}
	for i, l := range loads() {
		if l.err != nil || (!l.whole && longest < defaultReloadHold) {
			t.Errorf("load %d at %v: version %d whole=%v err=%v: a half-written file was loaded", i, l.start.Sub(last), l.version, l.whole, l.err)
		}
		if l.start.Before(last) && longest < defaultReloadHold {
			t.Errorf("load %d began %v before the last write ended: while the file was being written", i, last.Sub(l.start))
		}
	}
	l := loads()
	if got := l[len(l)-1].start.Sub(last); got > defaultReloadHold+bound {
		t.Errorf("the last version loaded %v after its write, more than the hold %v + the measured scheduling delay %v", got, defaultReloadHold, bound)
	}
	t.Logf("%d loads; the last %v after the last write (hold %v, longest pause %v, bound %v)", len(l), l[len(l)-1].start.Sub(last).Round(time.Millisecond), defaultReloadHold, longest, bound)
}
