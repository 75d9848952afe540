package schedprobe

import (
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestProbeSeesDelay: while every CPU is kept busy by more spinning
// goroutines than there are CPUs, the probe sees a delay, the runtime's
// scheduling latencies show goroutines waiting to run, and Bound is at
// least twice both.
func TestProbeSeesDelay(t *testing.T) {
	p := Start()
	// Poll for both: the probe's delay shows within a tick or two, but the
	// runtime records a goroutine's wait to run only when it runs again
	// (and for a sample of transitions), so the histogram may lag.
	spin(4*runtime.GOMAXPROCS(0), func() bool { return p.Worst() > 0 && p.SchedMax() > 0 })
	b := p.Stop()
	if p.Worst() <= 0 {
		t.Fatal("the probe saw no delay under load")
	}
	if p.SchedMax() <= 0 {
		t.Fatal("the runtime's scheduling latencies show no wait while goroutines spun")
	}
	if b < 2*p.Worst()+2*p.SchedMax()+p.RunDelay() {
		t.Fatalf("Bound %v below twice the worst delay %v plus twice the longest wait to run %v plus the threads' waits for a CPU %v", b, p.Worst(), p.SchedMax(), p.RunDelay())
	}
	if p.Stop() != b {
		t.Fatal("Stop is not idempotent")
	}
}

// TestProbeSeesThreadsWaitingForACPU: with more threads spinning than
// there are CPUs (GOMAXPROCS raised to four times the CPUs, as when other
// processes keep the CPUs busy), the kernel makes the process's threads
// wait for a CPU: RunDelay shows it and Bound counts it. Neither the
// probe, which runs on whichever thread is running, nor the runtime's
// histogram, which sees no goroutine wait for a P, need notice.
func TestProbeSeesThreadsWaitingForACPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/task/" + strconv.Itoa(os.Getpid()) + "/schedstat"); err != nil {
		t.Skip("no per-thread schedstat here (not Linux): RunDelay is zero")
	}
	spinners := 4 * runtime.NumCPU()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(spinners))
	p := Start()
	spin(spinners, func() bool { return p.RunDelay() >= 10*time.Millisecond })
	b := p.Stop()
	if p.RunDelay() < 10*time.Millisecond {
		t.Fatalf("threads spinning on %d Ps with %d CPUs waited %v for a CPU, want 10ms or more", spinners, runtime.NumCPU(), p.RunDelay())
	}
	if b < p.RunDelay() {
		t.Fatalf("Bound %v below the threads' waits for a CPU %v", b, p.RunDelay())
	}
	t.Logf("probe %v, runtime's longest wait to run %v, threads' waits for a CPU %v: Bound %v", p.Worst(), p.SchedMax(), p.RunDelay(), b)
}

// spin keeps n goroutines spinning until done reports true (polled every
// 10 ms) or 10 s have passed, then stops them.
func spin(n int, done func() bool) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for j := 0; j < 1e6; j++ {
				}
			}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for !done() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
}
