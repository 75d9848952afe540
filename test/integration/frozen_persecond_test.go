package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// frozenPerSecondYAML: one descriptor with a per-second and an hour limit,
// on the per-second and the main Redis; both far from full.
const frozenPerSecondYAML = `
domain: frozen
descriptors:
  - key: mixed
    rate_limits:
      - {unit: hour, requests_per_unit: 1000000}
      - {unit: second, requests_per_unit: 1000000}
`

// With a per-second Redis and the default failure mode (local), freezing
// either Redis (SIGSTOP) under a load of 50 ms calls answers no call
// UNAVAILABLE: the frozen Redis's part is decided on its embedded store,
// the other Redis still gets its share of the budget. Every OK is counted
// on the main Redis's hour counter once both answer again. (Before, the
// frozen part spent the budget and the other part failed at once: an
// attack saw 155 of 246 calls UNAVAILABLE.)
func TestPerSecondRedisFrozenNeverUnavailable(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	mainSrv, psSrv := redistest.StartStandalone(t), redistest.StartStandalone(t)
	cfg := filepath.Join(t.TempDir(), "frozen.yaml")
	writeFile(t, cfg, frozenPerSecondYAML)
	p := startServe(t, nil, "--config", cfg, "--backend", "redis", "--redis-url", mainSrv.URL(), "--redis-persecond-url", psSrv.URL())
	for _, frozen := range []struct {
		name string
		srv  *redistest.Server
	}{{"persecond", psSrv}, {"main", mainSrv}} {
		t.Run(frozen.name, func(t *testing.T) {
			value := "v-" + frozen.name
			ld := startLoad(8, 50*time.Millisecond, func(int) rlsv3.RateLimitServiceClient { return p.client() },
				func(c, i int) *rlsv3.RateLimitRequest {
					return &rlsv3.RateLimitRequest{Domain: "frozen", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("mixed", value)}}
				})
			frozen.srv.Pause()
			start := time.Now()
			testutil.WaitEvery(t, procPoll, 60*time.Second, "100 calls answered while frozen", func() bool {
				return ld.count(start, func(sample) bool { return true }) >= 100
			})
			frozen.srv.Resume()
			ld.stop()
			var ok, unavailable, other int
			for _, s := range ld.all() {
				switch {
				case s.err == nil && s.code == rlsv3.RateLimitResponse_OK:
					ok++
				case status.Code(s.err) == codes.Unavailable:
					unavailable++
				default:
					other++ // a deadline that passed at the client on a busy machine
				}
			}
			t.Logf("%s frozen: %d OK, %d UNAVAILABLE, %d other", frozen.name, ok, unavailable, other)
			if unavailable != 0 {
				t.Errorf("%d calls UNAVAILABLE under failure mode local", unavailable)
			}
			if ok == 0 {
				t.Fatal("no call answered OK")
			}
			// Every OK is in the hour counter (calls that timed out at the
			// client may have been allowed and counted too).
			pattern := fmt.Sprintf("*%d:%s*", len(value), value)
			testutil.WaitEvery(t, procPoll, 30*time.Second, "every OK counted on the main Redis", func() bool {
				return fixedCount(t, mainSrv.Client(), pattern) >= int64(ok)
			})
		})
	}
}

// At SIGTERM the hits allowed locally while Redis was frozen are written
// back once Redis answers again within --shutdown-grace after the drain;
// when it stays frozen they are lost, and the instance says how many.
// (Before, they were dropped silently: Redis counted 2 of 100.)
func TestShutdownWritesBackPendingHits(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	cfg := filepath.Join(t.TempDir(), "fm.yaml")
	writeFile(t, cfg, fmYAML)
	// call sends 20 calls on value and returns how many were answered OK
	// (decided locally); a call may miss its deadline at the client on a
	// busy machine.
	call := func(p *proc, value string) int64 {
		t.Helper()
		var ok int64
		for i := 0; i < 20; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			r, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "fm", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("k", value)}})
			cancel()
			switch {
			case err == nil && r.OverallCode == rlsv3.RateLimitResponse_OK:
				ok++
			case status.Code(err) != codes.DeadlineExceeded:
				t.Fatalf("call %d: %v %v, want OK decided locally", i, r, err)
			}
		}
		if ok == 0 {
			t.Fatal("no call answered OK")
		}
		return ok
	}
	t.Run("resumed", func(t *testing.T) {
		srv := redistest.StartStandalone(t)
		p := startServe(t, nil, "--config", cfg, "--backend", "redis", "--redis-url", srv.URL())
		srv.Pause()
		defer srv.Resume()
		ok := call(p, "resumed")
		p.cmd.Process.Signal(syscall.SIGTERM)
		testutil.WaitEvery(t, procPoll, 10*time.Second, "the write-backs at close", func() bool {
			return strings.Contains(p.Logs(), "writing back the hits allowed while Redis was away")
		})
		srv.Resume()
		<-p.exited
		if got := fixedCount(t, srv.Client(), "*7:resumed*"); got < ok {
			t.Errorf("Redis counted %d of the %d hits allowed locally", got, ok)
		}
		if strings.Contains(p.Logs(), "not written back") {
			t.Errorf("hits reported lost:\n%s", p.Logs())
		}
	})
	t.Run("frozen", func(t *testing.T) {
		srv := redistest.StartStandalone(t)
		p := startServe(t, nil, "--config", cfg, "--backend", "redis", "--redis-url", srv.URL(), "--shutdown-grace", "1s")
		srv.Pause()
		defer srv.Resume()
		ok := call(p, "frozen")
		if code := p.stop(t); code != 0 {
			t.Errorf("exit code %d", code)
		}
		m := regexp.MustCompile(`(\d+) hits of 1 keys allowed without Redis were not written back`).FindStringSubmatch(p.Logs())
		if m == nil {
			t.Fatalf("no warning naming the hits lost:\n%s", p.Logs())
		}
		if lost, _ := strconv.ParseInt(m[1], 10, 64); lost < ok {
			t.Errorf("%d hits reported lost, %d answered OK", lost, ok)
		}
	})
}
