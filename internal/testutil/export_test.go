package testutil

// HourEndWait exposes hourEndWait to the tests.
var HourEndWait = hourEndWait
