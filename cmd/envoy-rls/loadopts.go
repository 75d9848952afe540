package main

import (
	"flag"
	"fmt"
	"log/slog"
	"strings"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rlheaders"
)

// loadOptions select the files of a --config directory, how definitions of
// one domain combine, and the names of the legacy quota headers: what the
// reference server's RUNTIME_*, MERGE_DOMAIN_CONFIG and LIMIT_*_HEADER
// variables set.
type loadOptions struct {
	ConfigRecursive   bool
	ConfigAllFiles    bool
	ConfigDotfiles    bool
	MergeDomainConfig bool
	ConfigLenient     bool
	RLQS              bool
	QuotaMode         bool
	UsageAccounting   descriptors.UsageAccounting

	HeaderLimitName     string
	HeaderRemainingName string
	HeaderResetName     string
}

func addLoadFlags(fs *flag.FlagSet, o *loadOptions) {
	addFileFlags(fs, o)
	fs.BoolVar(&o.QuotaMode, "quota-mode", false, "treat every descriptor as quota_mode: a request is over the limit only when a descriptor that is not quota_mode is, or all quota_mode ones are; their hits are usage accounting (the reference's QUOTA_MODE)")
	o.UsageAccounting = descriptors.UsageAuto
	fs.TextVar(&o.UsageAccounting, "usage-accounting", o.UsageAccounting, "which charges are usage accounting, counted even when they do not fit (past the limit, or as token_bucket/gcra debt), for descriptors and files that set no usage_accounting, and every config over xDS: auto (hits given on the descriptor, its own hits_addend, as Envoy Gateway's cost.response and Envoy AI Gateway's token costs send them; ordinary admission charges nothing when denied), always (every charge, as the reference counts) or never (a denied request charges nothing); quota_mode descriptors account every charge")
	fs.StringVar(&o.HeaderLimitName, "response-headers-limit-name", rlheaders.LegacyLimit, "name of the limit field of --response-headers legacy (the reference's LIMIT_LIMIT_HEADER)")
	fs.StringVar(&o.HeaderRemainingName, "response-headers-remaining-name", rlheaders.LegacyRemaining, "name of the remaining field of --response-headers legacy (the reference's LIMIT_REMAINING_HEADER)")
	fs.StringVar(&o.HeaderResetName, "response-headers-reset-name", rlheaders.LegacyReset, "name of the reset field of --response-headers legacy (the reference's LIMIT_RESET_HEADER)")
}

// addFileFlags adds the flags that select and combine config files (serve
// and check-config share them).
func addFileFlags(fs *flag.FlagSet, o *loadOptions) {
	fs.BoolVar(&o.ConfigRecursive, "config-recursive", false, "a --config directory: also read its subdirectories (not through links to directories), as the reference server does")
	fs.BoolVar(&o.ConfigAllFiles, "config-all-files", false, "a --config directory: read every file, not only *.yaml and *.yml, as the reference server does")
	fs.BoolVar(&o.ConfigDotfiles, "config-dotfiles", false, "a --config directory: also read files and directories named .* (never Kubernetes' ..data entries), as the reference server does without RUNTIME_IGNOREDOTFILES")
	fs.BoolVar(&o.ConfigLenient, "config-lenient", false, "accept every config the reference server accepts, with its meaning, and log a warning for each thing accepted that way (a field given twice: the last is used; a field where it means nothing: ignored; requests_per_unit beside unlimited: ignored; no requests_per_unit: 0, every request denied; a later document of a file that does not load: skipped); on under the reference's environment")
	fs.BoolVar(&o.RLQS, "rlqs", false, "serve the Rate Limit Quota Service (Envoy's rate_limit_quota filter) on the gRPC port beside RLS, from the same config (see docs/rlqs.md); the config is then also refused where one quota bucket, which has no key order, could match two descriptors")
	fs.BoolVar(&o.MergeDomainConfig, "merge-domain-config", false, "let several files (or xDS resources) define one domain: their top-level descriptors are merged; one key and value defined twice is an error (the reference's MERGE_DOMAIN_CONFIG)")
}

// descriptorOptions are the loader's options.
func (o loadOptions) descriptorOptions() descriptors.Options {
	return descriptors.Options{
		Recursive:    o.ConfigRecursive,
		AllFiles:     o.ConfigAllFiles,
		Dotfiles:     o.ConfigDotfiles,
		MergeDomains: o.MergeDomainConfig,
		Lenient:      o.ConfigLenient,
		OrderFree:    o.RLQS,
	}
}

// legacyNames are the names of the legacy quota headers.
func (o loadOptions) legacyNames() rlheaders.LegacyNames {
	return rlheaders.LegacyNames{Limit: o.HeaderLimitName, Remaining: o.HeaderRemainingName, Reset: o.HeaderResetName}
}

// validateLoad checks the header names: each an HTTP field name, all three
// different.
func (o loadOptions) validateLoad() []error {
	var errs []error
	seen := map[string]string{}
	for _, h := range []struct{ flag, name string }{
		{"response-headers-limit-name", o.HeaderLimitName},
		{"response-headers-remaining-name", o.HeaderRemainingName},
		{"response-headers-reset-name", o.HeaderResetName},
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
	return errs
}

// logWarnings logs, once per load, what --config-lenient accepted as the
// reference server does: file:line and what was ignored or assumed.
func logWarnings(log *slog.Logger, cfg *descriptors.Config) {
	for _, w := range cfg.Warnings() {
		log.Warn("config accepted as the reference does: " + w.Error())
	}
}
