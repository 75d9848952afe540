package main

import (
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// scenario is one config and a sequence of requests, as a test of the
// reference's suite plays them.
type scenario struct {
	name      string
	config    string
	env       []string // the reference's environment
	flags     []string // envoy-rls's equivalent flags
	perSecond bool     // the steps must run within one second
	steps     []step
}

func wrap(n uint64) *wrapperspb.UInt64Value { return wrapperspb.UInt64(n) }

func d(kv ...string) desc {
	var x desc
	for i := 0; i+1 < len(kv); i += 2 {
		x.entries = append(x.entries, entry{kv[i], kv[i+1]})
	}
	return x
}

func (x desc) withHits(n uint64) desc { x.hits = &n; return x }

func (x desc) withOverride(n uint32, u typev3.RateLimitUnit) desc {
	x.override = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: u}
	return x
}

func req(domain string, ds ...desc) step { return step{domain: domain, descs: ds} }

func (s step) because(why string) step { s.intended = why; return s }

func repeat(n int, s step) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func cat(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func one(s ...step) []step { return s }

// Reasons of the intended differences; README's "Differences from the
// reference" table lists each.
const (
	allOrNothing = "all or nothing: a denied request charges nothing (the reference charges the limits that allowed)"
	checkNoRoom  = "a check (hits_addend 0) denies when no room is left for one hit (the reference passes it at exactly the limit)"
	invalidArg   = "an invalid request is InvalidArgument with its reason (the reference answers Unknown)"
)

// The configs, written after the reference's test configs.
const basicConfig = `
domain: basic
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: one_per_minute
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: key4
    rate_limit: {unit: day, requests_per_unit: 20}
`

// exampleConfig is the reference's Envoy example config (examples/ratelimit/config).
const exampleConfig = `
domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces: [{name: bkthomps}, {name: fake_name}]
      unit: minute
      requests_per_unit: 4
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit: {replaces: [{name: bkthomps}], unit: minute, requests_per_unit: 2}
      - key: destination_cluster
        value: mock
        rate_limit: {unit: minute, requests_per_unit: 1}
      - key: destination_cluster
        value: override
        rate_limit: {replaces: [{name: banned_limit}], unit: minute, requests_per_unit: 2}
      - key: destination_cluster
        value: fake
        rate_limit: {name: fake_name, unit: minute, requests_per_unit: 2}
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: bar
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: bar
        value: bkthomps
        rate_limit: {name: bkthomps, unit: minute, requests_per_unit: 1}
      - key: bar
        value: banned
        rate_limit: {name: banned_limit, unit: minute, requests_per_unit: 0}
      - key: baz
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: baz
        value: not-so-shady
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: baz
        value: shady
        rate_limit: {unit: minute, requests_per_unit: 3}
        shadow_mode: true
      - key: bay
        rate_limit: {unlimited: true}
  - key: unspec
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: qux
    rate_limit: {unlimited: true}
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota: {name: "service_1"}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata:
      service_with_quota: {name: "service_2"}
`

const shareConfig = `
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: files
    value: own/*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 2}
`

const reloadBefore = `
domain: reload
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: block
    rate_limit: {unit: minute, requests_per_unit: 0}
`

const reloadAfter = `
domain: reload
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: block
    rate_limit: {unit: minute, requests_per_unit: 3}
`

func u64(n uint64) *uint64 { return &n }

var scenarios = []scenario{{
	// test/integration: the basic config, unknown domain, one descriptor
	// over its limit, two descriptors of which one goes over.
	name:   "integration/basic",
	config: basicConfig,
	steps: cat(
		one(req("foo", d("hello", "world"))),
		one(req("basic", d("one_per_minute", "a")), req("basic", d("one_per_minute", "a"))),
		repeat(22, req("basic", d("key2", "r1"))),
		repeat(10, req("basic", d("key2", "r2"), d("key3", "r2"))),
		one(req("basic", d("key3", "r2"))),
		one(req("basic", d("key4", "durTest"))),
	),
}, {
	name:      "integration/per_second",
	config:    basicConfig,
	perSecond: true,
	// The harness compares the second of the minute a window ends; for a
	// one-second window that second differs between the runs of the
	// servers, so the reset of this scenario is not comparable.
	steps: repeat(3, req("basic", d("key1", "foo")).because("per-second windows: the harness cannot align the runs' seconds")),
}, {
	// test/integration's reload test, and rule 3: a lowered limit applies
	// to what was already used.
	name:   "integration/reload",
	config: reloadBefore,
	steps: cat(
		repeat(3, req("reload", d("k", "x"))),
		one(req("reload", d("block", "x"))),
		one(step{reload: reloadAfter}),
		repeat(2, req("reload", d("k", "x"))),
		// The reference counted the denied hit on block (limit 0).
		repeat(2, req("reload", d("block", "x")).because(allOrNothing)),
	),
}, {
	// integration-test/scripts/replaces.sh, request by request.
	name:   "example/replaces",
	config: exampleConfig,
	steps: cat(
		one(req("rl", d("foo", "bkthomps", "bar", "banned"))),
		one(req("rl", d("foo", "bkthomps", "bar", "banned"), d("source_cluster", "proxy", "destination_cluster", "mock")).because(allOrNothing)),
		repeat(3, req("rl", d("foo", "bkthomps", "bar", "banned"), d("source_cluster", "proxy", "destination_cluster", "override"))),
		repeat(3, req("rl", d("foo", "my_foo", "bar", "bkthomps"), d("source_cluster", "proxy", "destination_cluster", "bkthomps"))),
		one(req("rl", d("foo", "my_foo", "bar", "bkthomps"), d("source_cluster", "proxy", "destination_cluster", "not_bkthomps"))),
		repeat(5, req("rl", d("category", "account"), d("source_cluster", "proxy", "destination_cluster", "fake"))),
	),
}, {
	// trigger-ratelimit.sh, trigger-shadow-mode-key.sh, simple-get.sh,
	// value-included-in-stats-key-when-unspecified.sh.
	name:   "example/limits",
	config: exampleConfig,
	steps: cat(
		repeat(3, req("rl", d("foo", "f"))),
		repeat(5, req("rl", d("foo", "f", "baz", "shady"))),
		repeat(4, req("rl", d("foo", "f", "baz", "not-so-shady"))),
		repeat(2, req("rl", d("foo", "f", "bay", "x"), d("qux", "y"))),
		repeat(3, req("rl", d("unspec", "a"))),
		repeat(4, req("rl", d("foo", "g", "bar", "b"))),
	),
}, {
	// quota.sh: both quota descriptors are charged; the third request is
	// denied when both are over.
	name:   "example/quota",
	config: exampleConfig,
	steps:  repeat(3, req("rl", d("service", "service_1"), d("service", "service_2"))),
}, {
	// token-quota.sh: the route checks service_2 with 0 hits on the
	// request path and charges it 1 when the stream is done (sent only for
	// requests that passed).
	name:   "example/token_quota",
	config: exampleConfig,
	steps: cat(
		one(req("rl", d("service", "service_2").withHits(0))),
		one(step{domain: "rl", descs: []desc{d("service", "service_2").withHits(1)}, ifAllowed: true}),
		one(req("rl", d("service", "service_2").withHits(0))),
		one(step{domain: "rl", descs: []desc{d("service", "service_2").withHits(1)}, ifAllowed: true}),
		one(req("rl", d("service", "service_2").withHits(0)).because(checkNoRoom)),
		one(step{domain: "rl", descs: []desc{d("service", "service_2").withHits(1)}, ifAllowed: true}),
		one(req("rl", d("service", "service_2").withHits(0))),
		// A charge larger than what remains, and a check after it.
		one(req("rl", d("service", "service_1").withHits(5))),
		one(req("rl", d("service", "service_1").withHits(0))),
	),
}, {
	// multiservice-tokenquota.sh, with the reference's dynamic metadata on:
	// Envoy routes to the service named in the metadata of the passed
	// descriptors, and charges that service when the stream is done.
	name:   "example/multiservice_token_quota",
	config: exampleConfig,
	env:    []string{"RESPONSE_DYNAMIC_METADATA=true"},
	flags:  []string{"--response-dynamic-metadata"},
	steps: cat(func() []step {
		check := req("rl", d("service", "service_1").withHits(0), d("service", "service_2").withHits(0))
		charge := step{domain: "rl", descs: []desc{{entries: []entry{{"service", ""}}, hits: u64(1), fromMeta: true}}}
		// From the second check on, service_1 (1 per minute) has no room
		// left here, so the metadata routes to service_2 one request
		// earlier, and each service admits exactly its quota.
		out := []step{check, charge}
		for i := 1; i < 6; i++ {
			out = append(out, check.because(checkNoRoom), charge.because(checkNoRoom))
		}
		return out
	}()),
}, {
	// test/service: request limit overrides share the descriptor's counter.
	name:   "service/override",
	config: basicConfig,
	steps: cat(
		one(req("basic", d("key2", "o").withOverride(42, typev3.RateLimitUnit_MINUTE))),
		one(req("basic", d("key2", "o").withOverride(42, typev3.RateLimitUnit_MINUTE))),
		one(req("basic", d("key2", "o"))),
		one(req("basic", d("key2", "o").withOverride(41, typev3.RateLimitUnit_MINUTE))),
		one(req("basic", d("key2", "o").withOverride(3, typev3.RateLimitUnit_MINUTE))),
		one(req("basic", d("key2", "o").withOverride(10, typev3.RateLimitUnit_HOUR))),
		one(req("unknown", d("key2", "o").withOverride(10, typev3.RateLimitUnit_HOUR))),
	),
}, {
	// test/service: hits_addend of the request and of a descriptor.
	name:   "service/hits_addend",
	config: basicConfig,
	steps: cat(
		one(step{domain: "basic", descs: []desc{d("key2", "h")}, hits: 7}),
		one(req("basic", d("key2", "h").withHits(0))),
		one(step{domain: "basic", descs: []desc{d("key2", "h").withHits(5)}, hits: 100}),
		one(step{domain: "basic", descs: []desc{d("key2", "h")}, hits: 8}),
		one(req("basic", d("key2", "h").withHits(0)).because(checkNoRoom)),
		one(step{domain: "basic", descs: []desc{d("key2", "h")}, hits: 30}),
		one(req("basic", d("key2", "h"))),
	),
}, {
	// Envoy Gateway's cost.response on a plain descriptor (no quota_mode),
	// as Envoy AI Gateway's token budgets send it: a check with the
	// descriptor's hits_addend 0, then, when it passed, the cost as the
	// descriptor's hits_addend when the stream is done. Costs given on the
	// descriptor are usage accounting (usage_accounting auto): counted even
	// when they do not fit, as the reference counts every charge, so the
	// budget holds and the answers are the reference's. A request-path
	// cost (cost.request) that does not fit is counted too, as there.
	name:   "service/cost_response",
	config: basicConfig,
	steps: cat(
		one(req("basic", d("key3", "c").withHits(0))),
		one(step{domain: "basic", descs: []desc{d("key3", "c").withHits(4)}, ifAllowed: true}),
		one(req("basic", d("key3", "c").withHits(0))),
		one(step{domain: "basic", descs: []desc{d("key3", "c").withHits(8)}, ifAllowed: true}),
		one(req("basic", d("key3", "c").withHits(0))),
		one(step{domain: "basic", descs: []desc{d("key3", "c").withHits(3)}, ifAllowed: true}),
		one(req("basic", d("key3", "c2").withHits(7))),
		one(req("basic", d("key3", "c2").withHits(5))),
		one(req("basic", d("key3", "c2").withHits(0))),
	),
}, {
	// test/service: empty requests and descriptors.
	name:   "service/empty",
	config: basicConfig,
	steps: cat(
		one(req("", d("key2", "e")).because(invalidArg)),
		one(req("basic").because(invalidArg)),
		one(req("basic", d())),
		one(req("basic", d("", "x"))),
		one(req("basic", d("key2", "e"), d())),
		one(req("basic", d("key2", "e"), d("", ""))),
	),
}, {
	// test/service: response headers (LIMIT_RESPONSE_HEADERS_ENABLED).
	name:   "service/headers",
	config: basicConfig,
	env:    []string{"LIMIT_RESPONSE_HEADERS_ENABLED=true"},
	flags:  []string{"--response-headers=true"},
	steps: cat(
		one(req("basic", d("key2", "hd"), d("key3", "hd"))),
		one(req("basic", d("key3", "hd"))),
		one(req("basic", d("hello", "x"))),
	),
}, {
	// test/service: global shadow mode.
	name:   "service/global_shadow",
	config: basicConfig,
	env:    []string{"SHADOW_MODE=true"},
	flags:  []string{"--shadow-mode"},
	steps:  repeat(3, req("basic", d("one_per_minute", "s"))),
}, {
	// test/service: dynamic metadata off (the default) and on.
	name:   "service/metadata_off",
	config: exampleConfig,
	steps: cat(
		one(req("rl", d("service", "service_1"))),
		one(req("rl", d("service", "service_1"))),
	),
}, {
	name:   "service/metadata_on",
	config: exampleConfig,
	env:    []string{"RESPONSE_DYNAMIC_METADATA=true"},
	flags:  []string{"--response-dynamic-metadata"},
	steps: cat(
		one(req("rl", d("service", "service_1"), d("service", "service_2"))),
		one(step{domain: "rl", descs: []desc{d("service", "service_1").withHits(0), d("foo", "x").withOverride(9, typev3.RateLimitUnit_MINUTE)}, hits: 2}.because(checkNoRoom)),
		one(req("rl", d("service", "service_1"), d("nomatch", "x"))),
	),
}, {
	// test/config: share_threshold and wildcards.
	name:   "config/share_threshold",
	config: shareConfig,
	steps: cat(
		one(req("test-domain", d("files", "files/a"))),
		one(req("test-domain", d("files", "files/b"))),
		one(req("test-domain", d("files", "files/c"))),
		one(req("test-domain", d("files", "files/d"))),
		repeat(2, req("test-domain", d("files", "own/a"))),
		one(req("test-domain", d("files", "own/b"))),
		repeat(3, req("test-domain", d("nested", "parent", "files", "nested/x"))),
	),
}, {
	// Fixed windows: duration_until_reset of checks, of limits left
	// uncharged and of requests that can never pass.
	name:   "service/fixed_window_reset",
	config: basicConfig,
	steps: cat(
		one(req("basic", d("key2", "w").withHits(0))),
		// 21 hits given on the descriptor are usage accounting (the rule
		// of usage_accounting auto): counted although they do not fit, as
		// the reference counts them, so nothing is left here either.
		one(req("basic", d("key2", "w").withHits(21))),
		one(req("basic", d("key2", "w2"), d("one_per_minute", "w2"))),
		one(req("basic", d("key2", "w2"), d("one_per_minute", "w2")).because(allOrNothing)),
		one(req("basic", d("key2", "w2")).because(allOrNothing)),
	),
}}
