// Package schedprobe measures how late this process's goroutines run, so
// that tests can bound durations relative to the machine's measured
// scheduling delay instead of an absolute slack: on a busy machine a
// goroutine may wait tens of milliseconds for a CPU, and a bound that
// ignores it fails for reasons that have nothing to do with the code.
//
// Two measures are combined. A probe goroutine wakes on a timer every Tick
// and records how late it ran: it sees timers firing late and the whole
// process stalling. But a timer wakes its goroutine ahead of the others
// (it runs next on its P), so one probe does not see how long a goroutine
// readied behind many runnable ones waits: with 32 busy goroutines on 2 Ps
// under -race, a goroutine woken by a channel may wait ten times longer
// than the probe ever does. That wait is what the runtime's own histogram
// of scheduling latencies (runtime/metrics "/sched/latencies:seconds": how
// long each goroutine stayed runnable before it ran) records, for every
// goroutine of the process: the probe reads its maximum over its lifetime.
// Time a goroutine spends blocked (on a channel, a mutex, I/O) is not in
// it, so a bound built from these measures still fails when the code under
// test holds a goroutine.
//
// Neither sees everything, though. The runtime records one in eight of a
// goroutine's waits to run (runtime.gTrackingPeriod), so the one call a
// test times is usually not in the histogram. And on a machine whose CPUs
// other processes keep busy, the kernel stops and resumes this process's
// threads one by one: a goroutine whose thread waits for a CPU is
// "running" for the Go scheduler (no wait recorded), while the probe,
// woken on another thread, runs on time. So a third measure is the time
// the process's threads spent runnable but waiting for a CPU, the
// kernel's schedstat run_delay of each thread (Linux; zero elsewhere),
// summed over the threads: RunDelay. It caught what the other two missed:
// a Sentinel call returned 92 ms after its 200 ms deadline with the probe
// at 1 ms and the histogram at 0, while two busy loops ran beside the
// tests.
package schedprobe

import (
	"bytes"
	"math"
	"os"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Tick is how often a Probe wakes up.
const Tick = time.Millisecond

// latencies is the runtime metric of goroutine scheduling latencies.
const latencies = "/sched/latencies:seconds"

// Probe wakes a goroutine every Tick and records how much later than asked
// it ran: the worst delay is an estimate of how late a timer may fire, or
// how long the whole process may have stalled, while the probe ran. It
// also reads the runtime's scheduling latencies (see SchedMax).
type Probe struct {
	worst atomic.Int64 // ns
	stop  chan struct{}
	done  sync.WaitGroup
	start *metrics.Float64Histogram // the latencies when the probe started
	delay map[string]int64          // each thread's run_delay (ns) when the probe started

	stopOnce sync.Once
	sched    time.Duration // SchedMax at Stop
	run      time.Duration // RunDelay at Stop
}

// Start starts a probe. Call Stop to end it.
func Start() *Probe {
	p := &Probe{stop: make(chan struct{}), start: readLatencies(), delay: readRunDelays()}
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

// Worst returns the longest delay the probe goroutine saw so far.
func (p *Probe) Worst() time.Duration { return time.Duration(p.worst.Load()) }

// SchedMax returns the longest time any goroutine of the process stayed
// runnable before it ran since the probe started (until Stop), as the upper
// edge of the runtime histogram's bucket that holds it (so never less).
func (p *Probe) SchedMax() time.Duration {
	select {
	case <-p.stop:
		return p.sched
	default:
	}
	return maxSince(p.start, readLatencies())
}

// RunDelay returns how long the process's threads waited for a CPU while
// runnable since the probe started (until Stop), summed over the threads:
// at least as long as any goroutine of the process was kept from running
// by the kernel meanwhile, whichever threads it ran on. Zero where the
// kernel does not tell (not Linux, no schedstat).
func (p *Probe) RunDelay() time.Duration {
	select {
	case <-p.stop:
		return p.run
	default:
	}
	return runDelaySince(p.delay, readRunDelays())
}

// Bound returns the slack a duration measured while the probe ran may show
// over its ideal value. The measured goroutine may be delayed on its way in
// and on its way out: each time by a timer firing late or a stalled process
// (the probe's worst delay) and by a wait to run (SchedMax) — a goroutine
// woken at a deadline waits to run twice, once for the goroutine that
// cancels its context and once itself; and by the kernel keeping its
// thread from a CPU, which RunDelay counts in full, every wait of every
// thread. Plus two ticks of timer resolution.
func (p *Probe) Bound() time.Duration {
	return 2*p.Worst() + 2*p.SchedMax() + p.RunDelay() + 2*Tick
}

// Stop ends the probe and returns Bound. It is idempotent.
func (p *Probe) Stop() time.Duration {
	p.stopOnce.Do(func() {
		p.sched = maxSince(p.start, readLatencies())
		p.run = runDelaySince(p.delay, readRunDelays())
		close(p.stop)
		p.done.Wait()
	})
	return p.Bound()
}

// readRunDelays returns the run_delay of each thread of the process, in
// nanoseconds, by thread id: the second field of
// /proc/self/task/<tid>/schedstat. It returns nil where there is none.
func readRunDelays() map[string]int64 {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil
	}
	delays := make(map[string]int64, len(tasks))
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/schedstat")
		if err != nil {
			continue // the thread exited, or no schedstat
		}
		f := bytes.Fields(b)
		if len(f) < 2 {
			continue
		}
		if d, err := strconv.ParseInt(string(f[1]), 10, 64); err == nil {
			delays[task.Name()] = d
		}
	}
	return delays
}

// runDelaySince sums, over the threads of b, how much their run_delay grew
// since a; a thread not in a started since, so all of its delay counts.
func runDelaySince(a, b map[string]int64) time.Duration {
	if a == nil || b == nil {
		return 0
	}
	var sum int64
	for tid, d := range b {
		if d0, ok := a[tid]; ok {
			d -= d0
		}
		if d > 0 {
			sum += d
		}
	}
	return time.Duration(sum)
}

func readLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: latencies}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil // not supported by this runtime: the probe alone counts
	}
	return s[0].Value.Float64Histogram()
}

// maxSince returns the upper edge of the highest bucket of b whose count
// grew since a (the lower edge for the last, unbounded, bucket).
func maxSince(a, b *metrics.Float64Histogram) time.Duration {
	if a == nil || b == nil || len(a.Counts) != len(b.Counts) {
		return 0
	}
	for i := len(b.Counts) - 1; i >= 0; i-- {
		if b.Counts[i] > a.Counts[i] {
			edge := b.Buckets[i+1]
			if math.IsInf(edge, 1) {
				edge = b.Buckets[i]
			}
			return time.Duration(edge * float64(time.Second))
		}
	}
	return 0
}
