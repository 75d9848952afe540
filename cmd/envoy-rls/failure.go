package main

// The failure policy: what a call does when the backend fails or cannot
// answer in time.

import (
	"fmt"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// failureOptions are the failure policy and how long a call waits for the
// backend.
type failureOptions struct {
	Mode           rls.FailureMode
	LocalShare     float64
	BackendTimeout time.Duration
	// LogInterval is --backend-failure-log-interval.
	LogInterval time.Duration
}

func (o *failureOptions) addFlags(fs *flagSet) {
	fs.TextVar(&o.Mode, "failure-mode", rls.FailLocal, "when Redis fails or cannot answer in time: local (decide on an embedded store, write the allowed hits back later), allow (answer OK, write the hits back later) or deny (answer UNAVAILABLE so Envoy's failure_mode_deny applies)")
	fs.Float64Var(&o.LocalShare, "local-share", 1, "failure mode local: the share of each limit an instance allows on its own while Redis is away, in (0, 1] (1/N for N instances bounds the outage to the limit)")
	fs.DurationVar(&o.BackendTimeout, "backend-timeout", time.Second, "cap on the backend wait per request: a call waits until the caller's deadline less a margin for answering, at most this long (alone when the caller sends no deadline)")
	fs.DurationVar(&o.LogInterval, "backend-failure-log-interval", rls.DefaultLogInterval, "while backend calls keep failing, one log line per interval counts them and names their causes")
}

// validate checks the policy; c names where a value came from.
func (o failureOptions) validate(c *command) []error {
	var errs []error
	if !(o.LocalShare > 0 && o.LocalShare <= 1) {
		errs = append(errs, fmt.Errorf("--local-share %v: want a share in (0, 1]", o.LocalShare))
	}
	if o.BackendTimeout < 0 {
		errs = append(errs, fmt.Errorf("%s: must not be negative", c.value("backend-timeout", o.BackendTimeout.String())))
	}
	if o.LogInterval <= 0 {
		errs = append(errs, fmt.Errorf("%s: must be positive", c.value("backend-failure-log-interval", o.LogInterval.String())))
	}
	return errs
}
