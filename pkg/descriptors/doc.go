// Package descriptors loads the descriptor configuration of envoy-rls from
// YAML, validates it strictly and compiles it into a tree that matches
// request descriptors without allocating.
//
// A configuration written for envoyproxy/ratelimit loads unchanged and
// matches the same way. The extensions (default_algorithm, tiers, tier,
// rate_limits, algorithm, burst, window and a limit's own shadow_mode) are
// additive, and so are default_usage_accounting and usage_accounting.
//
// # Files
//
// Load takes one file or a directory. From a directory it reads every
// *.yaml and *.yml file in name order, skipping dotfiles and
// subdirectories. Each file holds one YAML document with one domain; a
// domain name may appear in only one file. Parse reads one document from
// memory.
//
// # Format
//
// The format is specified field by field in one place, the repository's
// docs/configuration.md (domain, descriptors with key, value, rate_limit,
// rate_limits, tier, shadow_mode, quota_mode, usage_accounting,
// share_threshold, detailed_metric, value_to_metric and metadata; a rate
// limit's unit or window, requests_per_unit, unlimited, name, replaces,
// algorithm, burst and shadow_mode). In short: a rate_limits list is a
// composite, allowed only when every limit in it allows; a tier is such a
// list defined once under tiers and used by name; an unlimited limit must
// be the only one of its list; sliding_window_log keeps one entry per
// request in its window, so it takes at most MaxSlidingLogRequests
// requests_per_unit. A value is taken as written, so `value: yes` is the
// string "yes" (the reference server, on yaml.v2, reads it as a boolean).
//
// # Validation
//
// Everything is checked, and every problem is reported at once as an Errors
// value, one "file:line: reason" per line: YAML syntax, unknown fields,
// fields given twice, values of the wrong type, missing keys, bad units,
// windows, counts and algorithms, burst with an algorithm that has none,
// unlimited combined with a limit, empty or self-referring replaces,
// unknown tiers, share_threshold without a wildcard, two descriptors with
// the same key and value at one level (a key-only descriptor and one with a
// value are different), an empty domain, and a domain defined twice.
//
// Options.Lenient (the reference server's environment) accepts instead what
// the reference server's config checker accepts, with the reference's
// meaning: a field given twice (the last one), a field of the format where
// it means nothing (ignored), a count beside unlimited (ignored), a missing
// count (0), and a later document of a file that does not load (skipped).
// Config.Warnings lists each such thing as "file:line: what was done".
//
// # Matching
//
// A request descriptor is a list of entries (key, value). Domain.Match
// walks the tree level by level. At each level an entry selects the
// descriptor with its key and exactly its value; failing that, the first
// descriptor of its key whose wildcard value matches (in file order; each *
// matches any run of characters, including none); failing that, the
// descriptor of its key without a value. Nothing is retried on another
// branch. The limits of the last selected descriptor apply, so a limit at
// depth k applies only to requests with exactly k entries. A selected
// descriptor without limits allows the request without limiting it.
//
// Each request value gets its own counter, except below a descriptor with
// share_threshold, where all values matching its wildcard share one
// (Node.CounterValue).
//
// # Identity
//
// RateLimit.ID is derived from a limit's algorithm and window only (and,
// for several limits of one descriptor with the same algorithm and window,
// their order among themselves), so renaming or moving a limit, reloading
// an unchanged configuration, or changing its requests_per_unit or burst
// keeps its counters: usage belongs to the descriptor, and a new count
// applies to what was already used. Changing its algorithm or window starts
// fresh.
//
// # Statistics keys
//
// Node.StatsKey gives the reference server's statistics key, such as
// "domain.key1_value1.key2": per level the key and, when the descriptor has
// one, its value or wildcard pattern. detailed_metric on the matched
// descriptor puts the request's values in at every level, value_to_metric
// at its own level; share_threshold keeps the pattern.
package descriptors
