package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// The flags that name Redis servers: any of them selects the redis backend
// when --backend is not given.
var redisAddrFlags = []string{"redis-url", "redis-sentinel", "redis-cluster"}

// redisOnly reports whether only the redis backend reads flag name: every
// --redis-* flag but the addresses, which select it, --key-prefix and
// --local-deny-cache. The flags of the embedded store (memoryFlags) are
// the memory backend's, or the redis backend's fallback store under
// --failure-mode local (refused in the other failure modes, which keep no
// store).
func redisOnly(name string) bool {
	switch name {
	case "redis-url", "redis-sentinel", "redis-cluster":
		return false
	case "key-prefix", "local-deny-cache", "approximate-sync-interval":
		return true
	}
	return strings.HasPrefix(name, "redis-")
}

// selectBackend settles --backend: without it, a Redis address selects
// redis and nothing selects memory. A flag that the selected backend does
// not read is an error rather than silently ignored, and so is --backend
// memory with a Redis address. It also reads a reference-style host:port
// --redis-url.
func (o *options) selectBackend() error {
	c := o.cmd
	addr := ""
	for _, f := range redisAddrFlags {
		if c.given(f) {
			addr = f
			break
		}
	}
	switch o.Backend {
	case "":
		o.Backend, o.BackendFrom = "memory", "default"
		if addr != "" {
			o.Backend, o.BackendFrom = "redis", c.source(addr)
		}
	case "memory":
		o.BackendFrom = c.source("backend")
		if addr != "" {
			return fmt.Errorf("%s needs the redis backend, but %s is \"memory\": drop --backend (then --%s selects Redis) or drop --%s",
				c.source(addr), c.source("backend"), addr, addr)
		}
	default:
		o.BackendFrom = c.source("backend")
	}
	switch o.Backend {
	case "memory":
		var err error
		c.fs.VisitAll(func(f *flag.Flag) {
			if err == nil && redisOnly(f.Name) && c.given(f.Name) {
				err = fmt.Errorf("%s applies to the redis backend, which needs --redis-url, --redis-sentinel or --redis-cluster", c.source(f.Name))
			}
		})
		if err != nil {
			return err
		}
	case "redis":
		for _, f := range memoryFlags {
			if c.given(f) && o.Failure.Mode != rls.FailLocal {
				return fmt.Errorf("%s applies to the memory backend and to the fallback store of --failure-mode local; the backend is redis (selected by %s) and the failure mode %s keeps no store", c.source(f), o.BackendFrom, o.Failure.Mode)
			}
		}
	}
	return nil
}
