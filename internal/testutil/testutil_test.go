package testutil_test

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/testutil"
)

func TestClockMovesOnlyWhenTold(t *testing.T) {
	c := testutil.NewClock(testutil.Base)
	if got := c.Now(); !got.Equal(testutil.Base) {
		t.Fatalf("Now = %v, want %v", got, testutil.Base)
	}
	c.Advance(1500 * time.Millisecond)
	c.Advance(-500 * time.Millisecond)
	if got, want := c.Now(), testutil.Base.Add(time.Second); !got.Equal(want) {
		t.Fatalf("after advancing: Now = %v, want %v", got, want)
	}
	c.Set(testutil.Base.Add(-time.Hour))
	if got, want := c.Now(), testutil.Base.Add(-time.Hour); !got.Equal(want) {
		t.Fatalf("after Set: Now = %v, want %v", got, want)
	}
}

func TestBaseIsAlignedToAnHour(t *testing.T) {
	if !testutil.Base.Equal(testutil.Base.Truncate(time.Hour)) {
		t.Errorf("Base %v is not aligned to an hour", testutil.Base)
	}
}

func TestWaitForReturnsOnceTheConditionHolds(t *testing.T) {
	n := 0
	testutil.WaitFor(t, time.Minute, "three polls", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Errorf("polled %d times, want 3", n)
	}
}

// TestFreePortIsNotPickedAgain: ports handed out by FreePort are distinct,
// the kernel picks none of them for a bind to port 0 (without the
// reservation, 100 ports of about 7,000 candidates would come back about 140
// times in 10,000 picks), and a server can bind each of them explicitly.
func TestFreePortIsNotPickedAgain(t *testing.T) {
	reserved := map[int]bool{}
	for range 100 {
		p := testutil.FreePort(t)
		if reserved[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		reserved[p] = true
	}
	for i := range 10_000 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if reserved[p] {
			t.Fatalf("bind %d to port 0 returned the reserved port %d", i, p)
		}
	}
	for p := range reserved {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("a server cannot bind the reserved port: %v", err)
		}
		l.Close()
	}
}

// TestHourEndWait: ClearOfHourEnd waits only in the last hourMargin before a
// full hour (UTC, as the epoch-aligned windows of an hour or longer end),
// until just past it.
func TestHourEndWait(t *testing.T) {
	for _, tc := range []struct {
		at   time.Duration // after Base, a full hour
		want time.Duration
	}{
		{0, 0},
		{10 * time.Minute, 0},
		{time.Hour - testutil.HourMargin, 0},
		{time.Hour - testutil.HourMargin + time.Millisecond, testutil.HourMargin - time.Millisecond + 10*time.Millisecond},
		{time.Hour - 30*time.Second, 30*time.Second + 10*time.Millisecond},
		{time.Hour - time.Microsecond, time.Microsecond + 10*time.Millisecond},
		{24*time.Hour - 5*time.Second, 5*time.Second + 10*time.Millisecond}, // a day's end is an hour's
	} {
		if got := testutil.HourEndWait(testutil.Base.Add(tc.at)); got != tc.want {
			t.Errorf("at Base+%v: wait %v, want %v", tc.at, got, tc.want)
		}
	}
}
