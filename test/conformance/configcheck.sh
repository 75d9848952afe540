#!/bin/sh
# configcheck.sh REF_CHECK ENVOY_RLS FILE...
#
# Checks each file alone (copied into an empty directory as config.yaml) with
# the reference's config checker (ratelimit_config_check, built from
# envoyproxy/ratelimit's src/config_check_cmd), with `envoy-rls
# check-config` (native, strict) and with `envoy-rls check-config
# --config-lenient` (what the reference's environment loads), and prints one
# line per file: "same" or "DIFF" for each mode, what each said, and the
# file; then the counts. Exit status 1 when some file is accepted by the
# reference and refused in lenient mode. Not part of CI: `make
# config-compare`.
set -u
ref=$1 rls=$2
shift 2
status=0
n=0 both=0 neither=0 refonly=0 rlsonly=0 lboth=0 lneither=0 lrefonly=0 lrlsonly=0
for f in "$@"; do
	d=$(mktemp -d)
	cp "$f" "$d/config.yaml"
	if "$ref" -config_dir "$d" >/dev/null 2>&1; then r=ok; else r=refused; fi
	if "$rls" check-config --config "$d" >/dev/null 2>&1; then e=ok; else e=refused; fi
	if "$rls" check-config --config "$d" --config-lenient >/dev/null 2>&1; then l=ok; else l=refused; fi
	m=same
	[ "$r" != "$e" ] && m=DIFF
	ml=same
	[ "$r" != "$l" ] && ml=DIFF
	[ "$r" = ok ] && [ "$l" = refused ] && status=1
	n=$((n + 1))
	case "$r/$e" in
	ok/ok) both=$((both + 1)) ;; refused/refused) neither=$((neither + 1)) ;;
	ok/refused) refonly=$((refonly + 1)) ;; refused/ok) rlsonly=$((rlsonly + 1)) ;;
	esac
	case "$r/$l" in
	ok/ok) lboth=$((lboth + 1)) ;; refused/refused) lneither=$((lneither + 1)) ;;
	ok/refused) lrefonly=$((lrefonly + 1)) ;; refused/ok) lrlsonly=$((lrlsonly + 1)) ;;
	esac
	printf 'native %-4s lenient %-4s reference=%-7s envoy-rls=%-7s lenient=%-7s %s\n' "$m" "$ml" "$r" "$e" "$l" "$f"
	rm -rf "$d"
done
printf '%d files\n' "$n"
printf 'native:  %d accepted by both, %d refused by both, %d accepted by the reference alone, %d by envoy-rls alone\n' "$both" "$neither" "$refonly" "$rlsonly"
printf 'lenient: %d accepted by both, %d refused by both, %d accepted by the reference alone, %d by envoy-rls alone\n' "$lboth" "$lneither" "$lrefonly" "$lrlsonly"
exit $status
