package rls

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/envoyrls/envoy-rls/internal/testutil"
)

func TestSampleLogOneLinePerInterval(t *testing.T) {
	var out bytes.Buffer
	level := new(slog.LevelVar)
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	clock := testutil.NewClock(testutil.Base)
	l := newSampleLog(log, "unknown domain", time.Second)
	l.now = clock.Now
	calls := 0
	ev := func(d string) {
		l.event(context.Background(), func() []any { calls++; return []any{"domain", d} })
	}
	// Info level: nothing, and the attributes are never built.
	ev("a")
	if out.Len() != 0 || calls != 0 {
		t.Fatalf("logged at info level: %q", out.String())
	}
	level.Set(slog.LevelDebug)
	ev("a")
	for i := 0; i < 5; i++ {
		clock.Advance(100 * time.Millisecond)
		ev("b")
	}
	clock.Advance(500 * time.Millisecond)
	ev("c")
	want := "level=DEBUG msg=\"unknown domain\" domain=a\nlevel=DEBUG msg=\"unknown domain\" domain=c similar_lines_skipped=5\n"
	if out.String() != want || calls != 2 {
		t.Fatalf("got %q (%d attribute calls), want %q", out.String(), calls, want)
	}
}

func TestDescribeDescriptorIsBounded(t *testing.T) {
	d := &commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}, {Key: "path", Value: "/x"}}}
	if got := describeDescriptor(d); got != "k=v, path=/x" {
		t.Fatalf("%q", got)
	}
	long := &commonv3.RateLimitDescriptor{}
	for i := 0; i < 32; i++ {
		long.Entries = append(long.Entries, &commonv3.RateLimitDescriptor_Entry{Key: strings.Repeat("k", 4096), Value: strings.Repeat("é", 2048)})
	}
	got := describeDescriptor(long)
	if len(got) > logDescriptorBytes+len("…") || !strings.HasSuffix(got, "…") || !strings.HasPrefix(got, strings.Repeat("k", logFieldBytes)+"…=") {
		t.Fatalf("%d bytes: %q", len(got), got)
	}
	if c := clip(strings.Repeat("é", 40), 63); !strings.HasSuffix(c, "…") || len(c) != 62+len("…") {
		t.Fatalf("clip cut a rune: %q", c)
	}
}
