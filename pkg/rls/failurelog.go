package rls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// failureLog reports backend failures without flooding the log: the first
// failure at once, then, while failures continue, one summary per interval
// with their count and causes, and a line when the backend answers again.
// A summary is written when its interval ends (a timer), not with the next
// failure, so counts never wait for traffic to be reported.
//
// When the store can be pinged (the Redis store), "recovered" means that
// it answered a ping at the end of an interval without failures: a call
// answered without an error proves nothing there (the local fallback, the
// local deny cache and lease chunks answer without Redis). The ping runs
// at the end of every interval until the backend answers, so the recovery
// is logged without traffic too. A store that cannot be pinged recovers
// at the end of an interval with successes and no failure.
type failureLog struct {
	log      *slog.Logger
	interval time.Duration
	mode     FailureMode
	timeout  time.Duration // the backend timeout, for the causes
	now      func() time.Time
	// ping asks the backend whether it answers; nil when it cannot.
	ping    func(context.Context) error
	stopped atomic.Bool // Close: no more ticks
	// failing is set from the first failure until the backend recovered:
	// only then do successes need counting.
	failing   atomic.Bool
	succeeded atomic.Int64

	mu       sync.Mutex
	armed    bool // a summary is due at the end of the interval
	since    time.Time
	total    int            // failures since the first one
	count    int            // failures in this interval
	causes   map[string]int // of the failures in this interval
	lastErr  string
	afterFor func(time.Duration, func()) // time.AfterFunc, replaced in tests
}

func newFailureLog(log *slog.Logger, interval time.Duration, mode FailureMode, timeout time.Duration, ping func(context.Context) error) *failureLog {
	return &failureLog{
		log: log, interval: interval, mode: mode, timeout: timeout, now: time.Now, ping: ping,
		causes:   map[string]int{},
		afterFor: func(d time.Duration, f func()) { time.AfterFunc(d, f) },
	}
}

// success records a call the backend answered. It costs one atomic load
// while the backend is healthy.
func (f *failureLog) success() {
	if f.failing.Load() {
		f.succeeded.Add(1)
	}
}

// failure records a failed call: err is the store's error, caller the
// context of the call, end whether the call's time budget ran out and
// which bound ended it.
func (f *failureLog) failure(caller context.Context, err error, end budgetEnd) {
	cause := failureCause(caller, err, end, f.timeout)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.total++
	if !f.failing.Load() {
		f.failing.Store(true)
		f.succeeded.Store(0)
		f.since = f.now()
		f.total = 1
	}
	if !f.armed {
		// The first failure, or the first after a quiet interval: at once.
		f.armed = true
		f.afterFor(f.interval, f.tick)
		f.log.Warn("rate limit backend failed", "cause", cause, "error", err.Error(),
			"failure_mode", f.mode.String(), "answer", f.answer(), "next_summary_in", f.interval.String())
		return
	}
	f.count++
	f.causes[cause]++
	f.lastErr = err.Error()
}

func (f *failureLog) answer() string {
	switch f.mode {
	case FailClosed:
		return "UNAVAILABLE"
	case FailLocal:
		return "decided on the embedded store (UNAVAILABLE when it cannot decide)"
	}
	return "OK"
}

// fallback records a call the store's local fallback decided: a failure
// of the backend, although the call returns no error (its success is not
// one of the backend's).
func (f *failureLog) fallback(err error) {
	f.failure(context.Background(), err, notEnded)
	f.succeeded.Add(-1)
}

// tick ends an interval: it writes the summary of the failures in it, or,
// when there were none and the backend answers again, says it recovered.
func (f *failureLog) tick() {
	if f.stopped.Load() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ok := max(f.succeeded.Swap(0), 0)
	if f.count > 0 {
		f.log.Warn("rate limit backend still failing", "failures", f.count, "succeeded", ok,
			"in_last", f.interval.String(), "causes", f.summary(), "last_error", f.lastErr,
			"failing_for", f.now().Sub(f.since).Round(time.Millisecond).String(), "answer", f.answer())
		f.count, f.lastErr = 0, ""
		clear(f.causes)
		f.afterFor(f.interval, f.tick)
		return
	}
	if f.ping != nil {
		// Recovered only once the backend answers: ask it, without the
		// lock (failures meanwhile are counted for the next interval).
		f.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), f.pingTimeout())
		err := f.ping(ctx)
		cancel()
		f.mu.Lock()
		if err != nil || f.count > 0 {
			// Still down, or failing again: ask again (or summarise) at
			// the end of the next interval.
			if !f.stopped.Load() {
				f.afterFor(f.interval, f.tick)
			}
			return
		}
		f.recovered()
		return
	}
	f.armed = false
	if ok > 0 {
		f.recovered()
	}
	// No failure and no success (no traffic): the next failure is
	// reported at once, as still part of this outage.
}

// recovered logs the end of the outage (f.mu held).
func (f *failureLog) recovered() {
	f.armed = false
	f.log.Info("rate limit backend recovered", "failures", f.total,
		"failed_for", f.now().Sub(f.since).Round(time.Millisecond).String())
	f.failing.Store(false)
	f.total = 0
}

// pingTimeout bounds the recovery ping: the backend timeout, at most the
// interval.
func (f *failureLog) pingTimeout() time.Duration {
	if f.timeout > 0 && f.timeout < f.interval {
		return f.timeout
	}
	return f.interval
}

// stop ends the ticks (the service closed).
func (f *failureLog) stop() { f.stopped.Store(true) }

// summary lists the causes, most frequent first: "connection refused: 12;
// timed out after 10ms (--backend-timeout): 3".
func (f *failureLog) summary() string {
	type kv struct {
		cause string
		n     int
	}
	var all []kv
	for c, n := range f.causes {
		all = append(all, kv{c, n})
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].n != all[j].n {
			return all[i].n > all[j].n
		}
		return all[i].cause < all[j].cause
	})
	var b strings.Builder
	for i, e := range all {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %d", e.cause, e.n)
	}
	return b.String()
}

// failureCause names what went wrong in words an operator can act on.
func failureCause(caller context.Context, err error, end budgetEnd, timeout time.Duration) string {
	var dns *net.DNSError
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var alert tls.AlertError
	var recordErr tls.RecordHeaderError
	switch {
	case errors.Is(caller.Err(), context.Canceled):
		return "the caller cancelled"
	case end == endedByCaller || errors.Is(caller.Err(), context.DeadlineExceeded):
		return "the caller's deadline came first (Envoy's timeout, less a margin to answer)"
	case end == endedByTimeout:
		return "timed out after " + timeout.String() + " (--backend-timeout)"
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case errors.Is(err, backend.ErrClosed):
		return "store closed (shutting down)"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.As(err, &dns):
		return "host not found: " + dns.Name
	case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.EPIPE):
		return "connection closed by the server"
	case errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH):
		return "host unreachable"
	case errors.As(err, &certErr) || errors.As(err, &unknownAuth) || errors.As(err, &hostErr):
		return "TLS certificate not accepted"
	case errors.As(err, &alert) || errors.As(err, &recordErr):
		return "TLS handshake failed"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "network timeout"
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "pool timeout"):
		return "connection pool exhausted (all connections busy)"
	case strings.Contains(msg, "NOAUTH") || strings.Contains(msg, "WRONGPASS"):
		return "authentication failed"
	}
	if len(msg) > 80 {
		msg = msg[:80] + "…"
	}
	return msg
}

// budgetEnd says whether a failed store call ran out of its time budget,
// and which bound ended it.
type budgetEnd uint8

const (
	notEnded       budgetEnd = iota // failed for another reason
	endedByTimeout                  // the backend timeout
	endedByCaller                   // the caller's deadline less the answer margin
)

// budgetEnded tells why a store call with the budget bd (zero: none), made
// from the caller's ctx, failed with err. A timeout (the context's, or the
// network's: go-redis sets its read deadline from the context) at the end
// of the budget is the budget's; the budget ends a margin before the
// caller's deadline when that one binds, else at the backend timeout.
func budgetEnded(ctx context.Context, bd time.Time, err error) budgetEnd {
	if bd.IsZero() {
		return notEnded
	}
	var ne net.Error
	timeout := errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
	if !timeout || time.Until(bd) > time.Millisecond {
		return notEnded
	}
	if d, ok := ctx.Deadline(); ok && d.Sub(bd) <= MaxAnswerMargin {
		return endedByCaller
	}
	return endedByTimeout
}

// BackendFallback records a request that the store decided without its
// shared backend (failure mode local: the embedded store decided it), so
// that the outage is counted in envoy_rls_backend_errors_total{mode="local"}
// and logged and summarised as the failures the store returns are. err is
// the shared backend's error.
func (s *Service) BackendFallback(err error) {
	s.opts.Metrics.backendError(err, FailLocal)
	if s.fails != nil {
		s.fails.fallback(err)
	}
}
