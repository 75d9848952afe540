// Package schedprobe measures how late this process's goroutines run, so
// that tests can bound durations relative to the machine's measured
// scheduling delay instead of an absolute slack: on a busy machine a
// goroutine may wait tens of milliseconds for a CPU, and a bound that
// ignores it fails for reasons that have nothing to do with the code.
package schedprobe

import (
	"sync"
	"sync/atomic"
	"time"
)

// Tick is how often a Probe wakes up.
const Tick = time.Millisecond

// Probe wakes a goroutine every Tick and records how much later than asked
// it ran: the worst delay is an estimate of how long any goroutine of the
// process may have waited for a CPU while the probe ran.
type Probe struct {
	worst atomic.Int64 // ns
	stop  chan struct{}
	done  sync.WaitGroup
}

// Start starts a probe. Call Stop to end it.
func Start() *Probe {
	p := &Probe{stop: make(chan struct{})}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		t := time.NewTimer(Tick)
		defer t.Stop()
		for {
			asked := time.Now().Add(Tick)
			t.Reset(Tick)
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
			late := int64(time.Since(asked))
			for {
				w := p.worst.Load()
				if late <= w || p.worst.CompareAndSwap(w, late) {
					break
				}
			}
		}
	}()
	return p
}

// Worst returns the longest delay seen so far.
func (p *Probe) Worst() time.Duration { return time.Duration(p.worst.Load()) }

// Bound returns the slack a duration measured while the probe ran may show
// over its ideal value: twice the worst delay seen (the measured goroutine
// may have been delayed once on its way in and once on its way out), plus
// two ticks of timer resolution.
func (p *Probe) Bound() time.Duration { return 2*p.Worst() + 2*Tick }

// Stop ends the probe and returns Bound.
func (p *Probe) Stop() time.Duration {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.done.Wait()
	return p.Bound()
}
