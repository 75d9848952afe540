package rls

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// testFailureLog returns a failureLog whose timer is in the test's hands:
// tick runs the summary due, pending says whether one is due.
func testFailureLog(mode FailureMode) (f *failureLog, out *bytes.Buffer, clock *testutil.Clock, tick func() bool) {
	return testPingedFailureLog(mode, nil)
}

// testPingedFailureLog is testFailureLog for a backend that ping asks.
func testPingedFailureLog(mode FailureMode, ping func(context.Context) error) (f *failureLog, out *bytes.Buffer, clock *testutil.Clock, tick func() bool) {
	out = &bytes.Buffer{}
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	clock = testutil.NewClock(testutil.Base)
	f = newFailureLog(log, 10*time.Second, mode, 10*time.Millisecond, ping)
	f.now = clock.Now
	var due []func()
	f.afterFor = func(d time.Duration, fn func()) {
		if d != 10*time.Second {
			panic(fmt.Sprintf("timer for %v", d))
		}
		due = append(due, fn)
	}
	tick = func() bool {
		if len(due) == 0 {
			return false
		}
		fn := due[0]
		due = due[1:]
		clock.Advance(10 * time.Second)
		fn()
		return true
	}
	return f, out, clock, tick
}

// lines returns what was logged since the last call, one string per line.
func lines(out *bytes.Buffer) []string {
	s := strings.TrimSpace(out.String())
	out.Reset()
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func TestFailureLogSummarisesEveryInterval(t *testing.T) {
	f, out, _, tick := testFailureLog(FailOpen)
	ctx := context.Background()
	refusedErr := fmt.Errorf("dial tcp 127.0.0.1:1: %w", syscall.ECONNREFUSED)

	f.success() // healthy: nothing
	f.failure(ctx, context.DeadlineExceeded, endedByTimeout)
	want := []string{`level=WARN msg="rate limit backend failed" cause="timed out after 10ms (--backend-timeout)" error="context deadline exceeded" failure_mode=allow answer=OK next_summary_in=10s`}
	if got := lines(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("first failure:\n got  %q\n want %q", got, want)
	}
	// More failures in the interval are only counted...
	for i := 0; i < 15; i++ {
		f.failure(ctx, refusedErr, notEnded)
	}
	f.failure(ctx, context.DeadlineExceeded, endedByTimeout)
	f.success()
	if got := lines(out); got != nil {
		t.Fatalf("logged within the interval: %q", got)
	}
	// ...and summed up when it ends, without waiting for another failure.
	if !tick() {
		t.Fatal("no summary due")
	}
	want = []string{`level=WARN msg="rate limit backend still failing" failures=16 succeeded=1 in_last=10s causes="connection refused: 15; timed out after 10ms (--backend-timeout): 1" last_error="context deadline exceeded" failing_for=10s answer=OK`}
	if got := lines(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("summary:\n got  %q\n want %q", got, want)
	}
	// Every interval while failures continue.
	f.failure(ctx, refusedErr, notEnded)
	tick()
	want = []string{`level=WARN msg="rate limit backend still failing" failures=1 succeeded=0 in_last=10s causes="connection refused: 1" last_error="dial tcp 127.0.0.1:1: connection refused" failing_for=20s answer=OK`}
	if got := lines(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("second summary:\n got  %q\n want %q", got, want)
	}
	// An interval with successes only: recovered, and quiet after that.
	f.success()
	tick()
	want = []string{`level=INFO msg="rate limit backend recovered" failures=18 failed_for=30s`}
	if got := lines(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("recovery:\n got  %q\n want %q", got, want)
	}
	if tick() {
		t.Fatal("a summary is due after recovery")
	}
	f.success()
	if f.succeeded.Load() != 0 {
		t.Fatal("successes counted while healthy")
	}
	// A new outage is reported at once again.
	f.failure(ctx, refusedErr, notEnded)
	if got := lines(out); len(got) != 1 || !strings.Contains(got[0], `msg="rate limit backend failed" cause="connection refused"`) {
		t.Fatalf("new outage: %q", got)
	}
}

func TestFailureLogQuietIntervalWithoutTraffic(t *testing.T) {
	f, out, _, tick := testFailureLog(FailClosed)
	ctx := context.Background()
	f.failure(ctx, backend.ErrClosed, notEnded)
	lines(out)
	tick() // no traffic at all: nothing to say, nothing due
	if got := lines(out); got != nil {
		t.Fatalf("logged without traffic: %q", got)
	}
	if tick() {
		t.Fatal("a summary is due without failures")
	}
	// The next failure is reported at once, within the same outage.
	f.failure(ctx, context.DeadlineExceeded, endedByTimeout)
	f.failure(ctx, context.DeadlineExceeded, endedByTimeout)
	tick()
	got := lines(out)
	if len(got) != 2 || !strings.Contains(got[0], "answer=UNAVAILABLE") || !strings.Contains(got[1], "failures=1 ") || !strings.Contains(got[1], "failing_for=20s") {
		t.Fatalf("after a quiet interval: %q", got)
	}
}

// With a backend that can be pinged (a real redis-server here), the local
// fallback's answers are no recovery: "recovered" is logged only once
// Redis answers, and then also without traffic; a Redis that never
// answered never "recovers", not at shutdown either.
func TestFailureLogRecoversWhenTheBackendAnswers(t *testing.T) {
	srv := redistest.StartStandalone(t)
	client := srv.Client()
	srv.Stop()
	f, out, _, tick := testPingedFailureLog(FailLocal, func(ctx context.Context) error { return client.Ping(ctx).Err() })
	refusedErr := fmt.Errorf("dial tcp 127.0.0.1:1: %w", syscall.ECONNREFUSED)
	// Calls the fallback decided: each a failure, and an answer without
	// an error that is not Redis's.
	for i := 0; i < 3; i++ {
		f.fallback(refusedErr)
		f.success()
	}
	if got := lines(out); len(got) != 1 || !strings.Contains(got[0], `msg="rate limit backend failed"`) {
		t.Fatalf("first failure: %q", got)
	}
	tick()
	if got := lines(out); len(got) != 1 || !strings.Contains(got[0], `msg="rate limit backend still failing" failures=2 succeeded=0 `) {
		t.Fatalf("summary of fallback calls: %q", got)
	}
	// Quiet while Redis is still down: no "recovered", and asked again
	// at the end of every interval.
	for i := 0; i < 3; i++ {
		if !tick() {
			t.Fatal("no probe due while Redis is down")
		}
	}
	if got := lines(out); got != nil {
		t.Fatalf("logged while Redis is down and no call came: %q", got)
	}
	// Redis back, no traffic: the next probe says so, once.
	srv.Restart()
	tick()
	want := []string{`level=INFO msg="rate limit backend recovered" failures=3 failed_for=50s`}
	if got := lines(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("recovery:\n got  %q\n want %q", got, want)
	}
	if tick() {
		t.Fatal("a probe is due after recovery")
	}
	// Closed while failing: the ticks stop.
	srv.Stop()
	f.fallback(refusedErr)
	lines(out)
	f.stop()
	tick()
	if tick() {
		t.Fatal("a tick is due after stop")
	}
	if got := lines(out); got != nil {
		t.Fatalf("logged after stop: %q", got)
	}
}

func TestFailureCause(t *testing.T) {
	live := context.Background()
	expired, cancel := context.WithDeadline(live, time.Unix(0, 0))
	defer cancel()
	cancelled, cancel2 := context.WithCancel(live)
	cancel2()
	for _, tc := range []struct {
		ctx  context.Context
		err  error
		end  budgetEnd
		want string
	}{
		{live, context.DeadlineExceeded, endedByTimeout, "timed out after 10ms (--backend-timeout)"},
		{live, fmt.Errorf("redis: %w", context.DeadlineExceeded), endedByTimeout, "timed out after 10ms (--backend-timeout)"},
		{live, context.DeadlineExceeded, notEnded, "timed out"},
		{expired, context.DeadlineExceeded, notEnded, "the caller's deadline came first (Envoy's timeout, less a margin to answer)"},
		{live, context.DeadlineExceeded, endedByCaller, "the caller's deadline came first (Envoy's timeout, less a margin to answer)"},
		{cancelled, context.Canceled, notEnded, "the caller cancelled"},
		{live, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, notEnded, "connection refused"},
		{live, &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Name: "redis.invalid", Err: "no such host", IsNotFound: true}}, notEnded, "host not found: redis.invalid"},
		{live, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, notEnded, "connection closed by the server"},
		{live, backend.ErrClosed, notEnded, "store closed (shutting down)"},
		{live, errors.New("redis: connection pool timeout"), notEnded, "connection pool exhausted (all connections busy)"},
		{live, errors.New("WRONGPASS invalid username-password pair"), notEnded, "authentication failed"},
		{live, errors.New("ERR something else"), notEnded, "ERR something else"},
	} {
		if got := failureCause(tc.ctx, tc.err, tc.end, 10*time.Millisecond); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.err, got, tc.want)
		}
	}
}
