package main

import (
	"testing"
	"time"
)

// TestEvictionOrder drives a limitListener of 3 connections and a reserve
// of 1 on a fake clock: a newcomer evicts the oldest connection silent for
// evictMinAge, else the least recently idle one idle that long, never a
// busy or a younger one; else it goes on the reserve, where only a silent
// reserved connection that old may be evicted; else it is refused.
func TestEvictionOrder(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	l := newLimitListener(nil, 3, 1)
	l.now = func() time.Time { return now }
	at := func(d time.Duration) { now = t0.Add(d) }
	names := map[*trackedConn]string{}
	admit := func(name string, wantVictim string, wantOK bool) *trackedConn {
		t.Helper()
		c := &trackedConn{l: l}
		names[c] = name
		v, ok := l.admit(c)
		if got := names[v]; got != wantVictim || ok != wantOK {
			t.Fatalf("%s at %v: victim %q, admitted %v; want %q, %v", name, now.Sub(t0), got, ok, wantVictim, wantOK)
		}
		if v != nil {
			l.closed(v) // the evicted connection closes
		}
		return c
	}
	admit("c1", "", true)
	c2 := admit("c2", "", true)
	l.busy(c2)
	at(500 * time.Millisecond)
	l.idleNow(c2)
	at(900 * time.Millisecond)
	c3 := admit("c3", "", true)
	at(1200 * time.Millisecond)
	admit("c4", "c1", true) // c1: silent 1.2 s
	at(1300 * time.Millisecond)
	// c3 and c4 silent < 1 s, c2 idle 0.8 s: on the reserve.
	c5 := admit("c5", "", true)
	if !c5.isReserved() {
		t.Fatal("c5 is not on the reserve")
	}
	admit("c6", "", false) // the reserve's c5 is 50 ms old
	at(1600 * time.Millisecond)
	admit("c7", "c2", true) // c2: idle 1.1 s; c3 silent 0.7 s
	l.busy(c3)
	at(10 * time.Second)
	// c3 busy; c4 and c7 silent for long: the oldest goes first.
	admit("c8", "c4", true)
	admit("c9", "c7", true)
	// c8, c9 young, c3 busy: the reserve's c5, silent 8.7 s.
	admit("c10", "c5", true)
	if l.open != 3 || l.reserved != 1 || l.closing != 0 || l.gauge.Load() != 4 {
		t.Errorf("open %d, reserved %d, closing %d, gauge %d; want 3, 1, 0, 4", l.open, l.reserved, l.closing, l.gauge.Load())
	}
}
