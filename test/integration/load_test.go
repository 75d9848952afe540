package integration

import (
	"context"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// sample is one call made by a load.
type sample struct {
	client  int // which caller made it
	err     error
	code    rlsv3.RateLimitResponse_Code
	latency time.Duration
	at      time.Time // when it was sent
}

// load keeps callers calling until stop, recording every call. Each call
// gets its own deadline; the load is bounded by the test that stops it.
type load struct {
	mu      sync.Mutex
	samples []sample
	done    chan struct{}
	wg      sync.WaitGroup
}

// startLoad starts callers goroutines; caller c sends request(c, i) for its
// i-th call to client(c) with a deadline of callDeadline.
func startLoad(callers int, callDeadline time.Duration, client func(c int) rlsv3.RateLimitServiceClient, request func(c, i int) *rlsv3.RateLimitRequest) *load {
	l := &load{done: make(chan struct{})}
	for c := 0; c < callers; c++ {
		l.wg.Add(1)
		go func(c int) {
			defer l.wg.Done()
			cl := client(c)
			for i := 0; ; i++ {
				select {
				case <-l.done:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), callDeadline)
				t0 := time.Now()
				r, err := cl.ShouldRateLimit(ctx, request(c, i))
				cancel()
				s := sample{client: c, err: err, latency: time.Since(t0), at: t0}
				if r != nil {
					s.code = r.OverallCode
				}
				l.mu.Lock()
				l.samples = append(l.samples, s)
				l.mu.Unlock()
			}
		}(c)
	}
	return l
}

// stop ends the load and waits for the callers.
func (l *load) stop() {
	close(l.done)
	l.wg.Wait()
}

// count returns how many calls sent at or after from satisfy pred.
func (l *load) count(from time.Time, pred func(sample) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.samples {
		if !s.at.Before(from) && pred(s) {
			n++
		}
	}
	return n
}

// all returns a copy of the samples so far.
func (l *load) all() []sample {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]sample(nil), l.samples...)
}
