package rls

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/envoyrls/envoy-rls/internal/textsafe"
)

// sampleLog writes at most one debug line per interval for one kind of
// event and counts the lines it left out, so a flood of requests for an
// unknown domain costs one line a second. When debug logging is off it
// costs one level check.
type sampleLog struct {
	log      *slog.Logger
	msg      string
	interval time.Duration
	now      func() time.Time

	mu      sync.Mutex
	last    time.Time
	skipped int
}

func newSampleLog(log *slog.Logger, msg string, interval time.Duration) *sampleLog {
	return &sampleLog{log: log, msg: msg, interval: interval, now: time.Now}
}

// event logs the event described by attrs (called only when a line is
// written) or counts it.
func (l *sampleLog) event(ctx context.Context, attrs func() []any) {
	if !l.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	l.mu.Lock()
	now := l.now()
	if !l.last.IsZero() && now.Sub(l.last) < l.interval {
		l.skipped++
		l.mu.Unlock()
		return
	}
	skipped := l.skipped
	l.last, l.skipped = now, 0
	l.mu.Unlock()
	args := attrs()
	if skipped > 0 {
		args = append(args, "similar_lines_skipped", skipped)
	}
	l.log.DebugContext(ctx, l.msg, args...)
}

// Bounds of what a log line quotes from a request.
const (
	logFieldBytes      = 64
	logDescriptorBytes = 256
)

// clip shortens s to n bytes at most, marking the cut; bytes of s that are
// not valid UTF-8 are written as \xNN first (textsafe.Escape), so that
// every log format shows them (JSON would turn them into U+FFFD).
func clip(s string, n int) string {
	s = textsafe.Escape(s)
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// describeDescriptor renders a request descriptor as "key=value, key=value",
// bounded for a log line.
func describeDescriptor(d *commonv3.RateLimitDescriptor) string {
	var b strings.Builder
	for j, e := range d.GetEntries() {
		if j > 0 {
			b.WriteString(", ")
		}
		b.WriteString(clip(e.GetKey(), logFieldBytes))
		b.WriteByte('=')
		b.WriteString(clip(e.GetValue(), logFieldBytes))
		if b.Len() > logDescriptorBytes {
			return clip(b.String(), logDescriptorBytes)
		}
	}
	return b.String()
}
