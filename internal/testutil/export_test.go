package testutil

// HourEndWait exposes hourEndWait to the tests.
var HourEndWait = hourEndWait

// HourMargin exposes hourMargin to the tests.
const HourMargin = hourMargin
