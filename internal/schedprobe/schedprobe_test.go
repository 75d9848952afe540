package schedprobe

import (
	"runtime"
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
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 4*runtime.GOMAXPROCS(0); i++ {
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
	// Poll for both: the probe's delay shows within a tick or two, but the
	// runtime records a goroutine's wait to run only when it runs again
	// (and for a sample of transitions), so the histogram may lag.
	for (p.Worst() == 0 || p.SchedMax() == 0) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	b := p.Stop()
	if p.Worst() <= 0 {
		t.Fatal("the probe saw no delay under load")
	}
	if p.SchedMax() <= 0 {
		t.Fatal("the runtime's scheduling latencies show no wait while goroutines spun")
	}
	if b < 2*p.Worst()+2*p.SchedMax() {
		t.Fatalf("Bound %v below twice the worst delay %v plus twice the longest wait to run %v", b, p.Worst(), p.SchedMax())
	}
	if p.Stop() != b {
		t.Fatal("Stop is not idempotent")
	}
}
