#!/bin/sh
# configcheck.sh REF_CHECK ENVOY_RLS FILE...
#
# Checks each file alone (copied into an empty directory as config.yaml) with
# the reference's config checker (ratelimit_config_check, built from
# envoyproxy/ratelimit's src/config_check_cmd) and with `envoy-rls
# check-config`, and prints one line per file: "same" or "DIFF", what each
# said, and the file. Exit status 1 when some file is accepted by the
# reference and refused by envoy-rls. Not part of CI: `make config-compare`.
set -u
ref=$1 rls=$2
shift 2
refused=0
for f in "$@"; do
	d=$(mktemp -d)
	cp "$f" "$d/config.yaml"
	if "$ref" -config_dir "$d" >/dev/null 2>&1; then r=ok; else r=refused; fi
	if "$rls" check-config --config "$d" >/dev/null 2>&1; then e=ok; else e=refused; fi
	m=same
	[ "$r" != "$e" ] && m=DIFF
	[ "$r" = ok ] && [ "$e" = refused ] && refused=1
	printf '%-4s reference=%-7s envoy-rls=%-7s %s\n' "$m" "$r" "$e" "$f"
	rm -rf "$d"
done
exit $refused
