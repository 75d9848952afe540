package main

// What the service decides and what its answers carry.

import (
	"fmt"
	"strings"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rlheaders"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// decisionOptions change how the limits decide: globally in shadow, every
// descriptor in quota mode, which charges are usage accounting, and where
// the limits that say nothing are decided (consistency).
type decisionOptions struct {
	ShadowMode      bool
	QuotaMode       bool
	UsageAccounting descriptors.UsageAccounting
	Consistency     descriptors.Consistency
}

func (o *decisionOptions) addFlags(fs *flagSet) {
	fs.BoolVar(&o.ShadowMode, "shadow-mode", false, "answer OK overall whatever the limits decide (statuses and metrics still tell), to try a config safely")
	fs.BoolVar(&o.QuotaMode, "quota-mode", false, "treat every descriptor as quota_mode: a request is over the limit only when a descriptor that is not quota_mode is, or all quota_mode ones are; their hits are usage accounting (the reference's QUOTA_MODE)")
	o.UsageAccounting = descriptors.UsageAuto
	fs.TextVar(&o.UsageAccounting, "usage-accounting", o.UsageAccounting, "which charges are usage accounting, counted even when they do not fit (past the limit, or as token_bucket/gcra debt), for descriptors and files that set no usage_accounting, and every config over xDS: auto (hits given on the descriptor, its own hits_addend, as Envoy Gateway's cost.response and Envoy AI Gateway's token costs send them; ordinary admission charges nothing when denied), always (every charge, as the reference counts) or never (a denied request charges nothing); quota_mode descriptors account every charge")
	o.Consistency = descriptors.ConsistencyStrict
	fs.TextVar(&o.Consistency, "consistency", o.Consistency, "default consistency of the limits whose file sets none, and of every config over xDS, whose format cannot say it (then every limit, usage budgets included): strict (every decision in Redis), lease (from chunks of the limit reserved in Redis; never more than the limit) or approximate (on local counters synced in the background, within a stated bound); see docs/consistency.md. Every limit is strict on the memory backend, and so are sliding_window_log limits and requests' limit overrides")
}

// responseOptions say what answers carry beside the codes: quota headers,
// the body of denials, dynamic metadata.
type responseOptions struct {
	Headers rls.HeaderMode
	// LimitName, RemainingName and ResetName name the legacy headers.
	LimitName, RemainingName, ResetName string
	OverLimitBody                       string
	DynamicMetadata                     bool

	// body is OverLimitBody parsed (by validate), nil when empty.
	body *rls.BodyTemplate
}

func (o *responseOptions) addFlags(fs *flagSet) {
	fs.TextVar(&o.Headers, "response-headers", rls.HeadersOff, "quota headers added to responses: off, ietf (RateLimit-Policy and RateLimit), draft03 (X-RateLimit-*), legacy (RateLimit-Limit/-Remaining/-Reset; true means legacy, false off) or all; Retry-After comes with every OVER_LIMIT whatever this says")
	fs.StringVar(&o.LimitName, "response-headers-limit-name", rlheaders.LegacyLimit, "name of the limit field of --response-headers legacy (the reference's LIMIT_LIMIT_HEADER)")
	fs.StringVar(&o.RemainingName, "response-headers-remaining-name", rlheaders.LegacyRemaining, "name of the remaining field of --response-headers legacy (the reference's LIMIT_REMAINING_HEADER)")
	fs.StringVar(&o.ResetName, "response-headers-reset-name", rlheaders.LegacyReset, "name of the reset field of --response-headers legacy (the reference's LIMIT_RESET_HEADER)")
	fs.StringVar(&o.OverLimitBody, "over-limit-body", "", `JSON body of OVER_LIMIT answers (raw_body), with {{rule}}, {{domain}}, {{descriptor_index}} and {{retry_after}} filled in, e.g. {"error":"rate_limited","rule":"{{rule}}","retry_after":{{retry_after}}}`)
	fs.BoolVar(&o.DynamicMetadata, "response-dynamic-metadata", false, "return dynamic_metadata as the reference does with RESPONSE_DYNAMIC_METADATA=true: domain, descriptors, hitsAddend and the metadata of the passed descriptors")
}

// validate checks the header names (each an HTTP field name, all three
// different) and parses the body template.
func (o *responseOptions) validate() []error {
	var errs []error
	seen := map[string]string{}
	for _, h := range []struct{ flag, name string }{
		{"response-headers-limit-name", o.LimitName},
		{"response-headers-remaining-name", o.RemainingName},
		{"response-headers-reset-name", o.ResetName},
	} {
		if !rlheaders.ValidFieldName(h.name) {
			errs = append(errs, fmt.Errorf("--%s=%q is not an HTTP field name (letters, digits and !#$%%&'*+-.^_`|~)", h.flag, h.name))
			continue
		}
		if other, ok := seen[strings.ToLower(h.name)]; ok {
			errs = append(errs, fmt.Errorf("--%s and --%s both name %q", other, h.flag, h.name))
		}
		seen[strings.ToLower(h.name)] = h.flag
	}
	o.body = nil
	if o.OverLimitBody != "" {
		var err error
		if o.body, err = rls.ParseBodyTemplate(o.OverLimitBody); err != nil {
			errs = append(errs, fmt.Errorf("--over-limit-body: %v", err))
		}
	}
	return errs
}

// legacyNames are the names of the legacy quota headers.
func (o responseOptions) legacyNames() rlheaders.LegacyNames {
	return rlheaders.LegacyNames{Limit: o.LimitName, Remaining: o.RemainingName, Reset: o.ResetName}
}
