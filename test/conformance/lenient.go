package main

// lenientConfig holds what the reference accepts and native envoy-rls
// refuses: the domain and a unit given twice (the last wins), a count
// missing (0), unlimited with a count, fields where they mean nothing
// (shadow_mode in a rate_limit included), rate_limit given twice (merged),
// a field written before a << that also gives it (the merged value), and
// an invalid second document (the reference reads only the first).
const lenientConfig = `
domain: old
domain: lenient
unit: second
descriptors:
  - key: dup
    rate_limit:
      unit: minute
      requests_per_unit: 2
      unit: hour
  - key: deny
    rate_limit: {unit: minute}
  - key: unl
    rate_limit: {unlimited: true, requests_per_unit: 1}
  - key: mis
    requests_per_unit: 4
    rate_limit: {unit: minute, requests_per_unit: 1, shadow_mode: true}
  - key: merged
    rate_limit: {unit: minute, requests_per_unit: 2}
    rate_limit: {unit: hour}
  - key: anchor
    rate_limit: &rl {unit: hour, requests_per_unit: 2}
  - key: merge_key
    rate_limit:
      unit: minute
      <<: *rl
---
domain: other
descriptors:
  - key: z
    rate_limit: {unit: fortnight, requests_per_unit: 1}
`

// The config/lenient scenario: each limit of lenientConfig must mean what
// it means to the reference.
func init() {
	scenarios = append(scenarios, scenario{
		// Files the reference accepts and native envoy-rls refuses, loaded as
		// the reference's environment loads them (--config-lenient): each
		// limit must mean what it means to the reference.
		name:   "config/lenient",
		config: lenientConfig,
		flags:  []string{"--config-lenient"},
		steps: cat(
			repeat(3, req("lenient", d("dup", "x"))),
			repeat(2, req("lenient", d("deny", "x"))),
			repeat(3, req("lenient", d("unl", "x"))),
			repeat(2, req("lenient", d("mis", "x"))),
			repeat(3, req("lenient", d("merged", "x"))),
			repeat(3, req("lenient", d("merge_key", "x"))),
			one(req("old", d("dup", "x"))),
			one(req("other", d("z", "x"))),
		),
	})
}
