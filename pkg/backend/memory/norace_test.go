//go:build !race

package memory_test

// raceEnabled reports a -race build: floods through Apply run about ten
// times slower under it.
const raceEnabled = false
