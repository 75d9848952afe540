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
//	domain: <name>                     required, non-empty, unique
//	default_algorithm: <algorithm>     extension; default fixed_window
//	default_usage_accounting: <usage>  extension: auto, always or never
//	tiers:                             extension; name -> list of rate limits
//	  <name>:
//	    - <rate limit>
//	descriptors:
//	  - key: <key>                     required, non-empty
//	    value: <value>                 optional; may hold * wildcards
//	    rate_limit: <rate limit>       at most one of rate_limit,
//	    rate_limits: [<rate limit>...]   rate_limits (extension)
//	    tier: <name>                     and tier (extension)
//	    shadow_mode: <bool>
//	    quota_mode: <bool>
//	    usage_accounting: <usage>      extension; nested descriptors
//	                                   inherit it (see UsageAccounting)
//	    detailed_metric: <bool>
//	    value_to_metric: <bool>
//	    share_threshold: <bool>        only with a wildcard value
//	    metadata: <mapping>            any YAML mapping
//	    descriptors: [<descriptor>...] nested descriptors
//
// A rate limit is a mapping:
//
//	unit: <unit>                   second, minute, hour, day, week,
//	                               month (30 days) or year (365 days);
//	                               any letter case
//	window: <duration>             extension, instead of unit: a Go
//	                               duration such as 90s or 1h30m, >= 1ms
//	requests_per_unit: <integer>   required, 0 to 4294967295; 0 denies
//	                               every request
//	unlimited: <bool>              always allow, keep no counter; not
//	                               with unit, window, requests_per_unit,
//	                               algorithm or burst
//	name: <name>                   for replaces
//	replaces: [{name: <name>}...]  drop the named limits when this one
//	                               applies to the same request
//	algorithm: <algorithm>         extension; default default_algorithm
//	burst: <integer>               extension, 1 to 4294967295; the
//	                               capacity of token_bucket and gcra
//	                               (default requests_per_unit)
//	shadow_mode: <bool>            extension: this limit only is shadowed
//
// The algorithms are fixed_window (the reference server's), token_bucket,
// sliding_window_log, sliding_window_counter and gcra; see package
// algorithms. sliding_window_log keeps one entry per request in its window,
// so it takes at most 100000 requests_per_unit.
//
// A rate_limits list is a composite: a request is allowed only when every
// limit in it allows. A tier is such a list defined once under tiers and
// used by name; unused tiers are fine. An unlimited limit must be the only
// one of its list.
//
// YAML details: a value is taken as written, so `value: yes` is the string
// "yes" (the reference server, on yaml.v2, reads it as a boolean). Flags
// accept true/false and the YAML 1.1 spellings yes/no/on/off. A null value
// (`rate_limit:` with nothing after it) counts as not set, and an empty
// value as no value, as in the reference server.
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
