package testutil_test

import (
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
