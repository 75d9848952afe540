package main

import (
	"os"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Reload timing. A change is reloaded once the config's entries have been
// quiet for reloadSettle, and at the latest reloadMaxDelay after the first
// change not yet reloaded, however many keep coming: what an atomic
// replacement (a rename over a file, a ConfigMap's ..data symlink swap)
// gets, since a reader sees the old file or the new one, never half of
// one. A file written in place holds the reload until it has been left
// alone for --config-reload-hold (defaultReloadHold), so that a writer
// pausing mid-file is never loaded half-written.
const (
	reloadSettle      = 200 * time.Millisecond
	reloadMaxDelay    = 2 * time.Second
	defaultReloadHold = 2 * time.Second
)

// reloadPlan decides when the changes seen so far are reloaded. Its
// methods take the time, so that tests can drive it.
type reloadPlan struct {
	hold time.Duration
	// first and last are the first and the last change not yet reloaded
	// (zero: none).
	first, last time.Time
	// writes holds, by the name fsnotify gives, the last time each file
	// that is being written in place was seen written.
	writes map[string]time.Time
	// lost is when events may have been lost (zero: never since the last
	// reload): every file may then be half written.
	lost time.Time
}

func newReloadPlan(hold time.Duration) *reloadPlan {
	return &reloadPlan{hold: hold, writes: map[string]time.Time{}}
}

// event records a change of the config. A write to a file is an in-place
// write: the file may be half written. A new name is a file renamed (or a
// symlink swapped) into place, complete, or a new file that its writer
// fills in place, whose writes follow; a new empty file is taken as the
// latter at once, in case its writer pauses before the first write. A name
// renamed away or removed holds nothing.
func (p *reloadPlan) event(ev fsnotify.Event, now time.Time) {
	if p.first.IsZero() {
		p.first = now
	}
	p.last = now
	switch {
	case ev.Has(fsnotify.Write):
		p.writes[ev.Name] = now
	case ev.Has(fsnotify.Create):
		delete(p.writes, ev.Name) // replaced: what was written there is gone
		if st, err := os.Lstat(ev.Name); err == nil && st.Mode().IsRegular() && st.Size() == 0 {
			p.writes[ev.Name] = now
		}
	case ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
		delete(p.writes, ev.Name)
	}
}

// unknown records that events may have been lost at now.
func (p *reloadPlan) unknown(now time.Time) {
	if p.first.IsZero() {
		p.first = now
	}
	p.last, p.lost = now, now
}

// due returns when the changes recorded are to be reloaded, and false when
// there are none. mtime returns a file's modification time (false when it
// is gone): a file written in place holds the reload until hold after its
// last write, seen as an event or in its modification time (which a write
// whose event is still on its way has already moved).
func (p *reloadPlan) due(now time.Time, mtime func(name string) (time.Time, bool)) (time.Time, bool) {
	if p.first.IsZero() {
		return time.Time{}, false
	}
	due := p.last.Add(reloadSettle)
	if latest := p.first.Add(reloadMaxDelay); latest.Before(due) {
		due = latest
	}
	later := func(t time.Time) {
		if t.After(due) {
			due = t
		}
	}
	for name, w := range p.writes {
		mt, ok := mtime(name)
		if !ok {
			delete(p.writes, name) // gone: it holds nothing
			continue
		}
		if mt.After(w) && !mt.After(now) { // a future time (a skewed clock) is not waited for
			w = mt
		}
		later(w.Add(p.hold))
	}
	if !p.lost.IsZero() {
		later(p.lost.Add(p.hold))
	}
	return due, true
}

// reset forgets the changes: they are reloaded.
func (p *reloadPlan) reset() {
	p.first, p.last, p.lost = time.Time{}, time.Time{}, time.Time{}
	clear(p.writes)
}

// modTime is the modification time of the file at name, through symlinks.
func modTime(name string) (time.Time, bool) {
	st, err := os.Stat(name)
	if err != nil {
		return time.Time{}, false
	}
	return st.ModTime(), true
}
