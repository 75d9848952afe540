package memory

import "testing"

// TestAllocSize checks the allocator estimate against Go's size classes
// around a few sizes: never below the object, at most 1/8 (or 16 bytes)
// above the class Go uses.
func TestAllocSize(t *testing.T) {
	for _, c := range []struct{ n, class int }{
		{1, 16}, {16, 16}, {17, 32}, {100, 112}, {200, 208}, {600, 640}, {1000, 1024},
		{1025, 1152}, {4096, 4096}, {4100, 4864}, {20000, 20480}, {40000, 40960},
	} {
		got := allocSize(c.n)
		if got < c.class || got > c.class+max(16, c.class/8) {
			t.Errorf("allocSize(%d) = %d, Go's class is %d", c.n, got, c.class)
		}
	}
}
