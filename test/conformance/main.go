// Command conformance replays request sequences taken from the reference
// server's own test suite (envoyproxy/ratelimit: its integration tests,
// service tests, config tests and the Envoy example scripts of its
// integration-test directory) against the reference server and against
// envoy-rls (embedded store and Redis store), on the same configs, and
// prints every difference, classified as intended (documented in README's
// table of differences, with its reason) or not.
//
// It is not part of CI: it needs a reference binary built from the public
// repository. Run it with
//
//	make conformance REF_BIN=/path/to/ratelimit
//
// It starts its own redis-server processes (one per server under test) on
// free loopback ports, and its own servers; nothing is shared with other
// runs. The reference keeps fixed windows aligned to the wall clock, so a
// scenario starts only when enough of the current minute is left to finish
// it in the same window; a run takes a few minutes.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

func main() {
	refBin := flag.String("ref-bin", os.Getenv("REF_BIN"), "the reference server binary (envoyproxy/ratelimit's cmd, built from its repository)")
	rlsBin := flag.String("rls-bin", "", "the envoy-rls binary (default: built from this repository into a temporary directory)")
	only := flag.String("run", "", "run only scenarios whose name matches this regular expression")
	verbose := flag.Bool("v", false, "print identical steps too")
	flag.Parse()
	if *refBin == "" {
		fmt.Fprintln(os.Stderr, "conformance: -ref-bin (or REF_BIN) is required")
		os.Exit(2)
	}
	if err := run(*refBin, *rlsBin, *only, *verbose, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(1)
	}
}

// target is one server under test.
type target struct {
	name  string
	start func(sc *scenario, dir string) (*server, error)
}

func run(refBin, rlsBin, only string, verbose bool, out io.Writer) error {
	tmp, err := os.MkdirTemp("", "conformance-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if rlsBin == "" {
		rlsBin = filepath.Join(tmp, "envoy-rls")
		build := exec.Command("go", "build", "-o", rlsBin, "./cmd/envoy-rls")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("building envoy-rls: %v", err)
		}
	}
	var filter *regexp.Regexp
	if only != "" {
		if filter, err = regexp.Compile(only); err != nil {
			return err
		}
	}
	targets := []target{
		{"reference", func(sc *scenario, dir string) (*server, error) { return startReference(refBin, sc, dir) }},
		{"envoy-rls/memory", func(sc *scenario, dir string) (*server, error) { return startRLS(rlsBin, "memory", sc, dir) }},
		{"envoy-rls/redis", func(sc *scenario, dir string) (*server, error) { return startRLS(rlsBin, "redis", sc, dir) }},
	}
	var total tally
	for i := range scenarios {
		sc := &scenarios[i]
		if filter != nil && !filter.MatchString(sc.name) {
			continue
		}
		results := make([][]result, len(targets))
		for ti, tg := range targets {
			dir := filepath.Join(tmp, fmt.Sprintf("s%d-t%d", i, ti))
			res, err := replay(tg, sc, dir)
			if err != nil {
				return fmt.Errorf("%s on %s: %v", sc.name, tg.name, err)
			}
			results[ti] = res
		}
		for ti := 1; ti < len(targets); ti++ {
			t := compare(out, sc, targets[ti].name, results[0], results[ti], verbose)
			total.add(t)
		}
	}
	fmt.Fprintf(out, "\nsteps compared: %d (each envoy-rls store against the reference)\n", total.identical+total.intended+total.unintended)
	fmt.Fprintf(out, "identical: %d\nintended differences: %d\nunintended differences: %d\n", total.identical, total.intended, total.unintended)
	if total.unintended > 0 {
		return fmt.Errorf("%d unintended differences", total.unintended)
	}
	return nil
}

type tally struct{ identical, intended, unintended int }

func (t *tally) add(o tally) {
	t.identical += o.identical
	t.intended += o.intended
	t.unintended += o.unintended
}

// result is one step's normalized answer: field name -> value.
type result struct {
	skipped bool
	fields  map[string]string
}

func replay(tg target, sc *scenario, dir string) ([]result, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	srv, err := tg.start(sc, dir)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	waitForWindow(sc)
	var out []result
	var last *rlsv3.RateLimitResponse
	for _, st := range sc.steps {
		if st.reload != "" {
			if err := srv.reload(st.reload); err != nil {
				return nil, err
			}
			out = append(out, result{skipped: true})
			continue
		}
		req := st.request(last)
		if req == nil {
			out = append(out, result{skipped: true})
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		sent := time.Now()
		resp, err := rlsv3.NewRateLimitServiceClient(srv.conn).ShouldRateLimit(ctx, req)
		cancel()
		out = append(out, result{fields: normalize(resp, err, sent)})
		if err == nil {
			last = resp
		}
	}
	return out, nil
}

// waitForWindow waits until the scenario can run within one minute (and,
// for per-second limits, at the start of a second), as the reference's
// windows are aligned to the wall clock.
func waitForWindow(sc *scenario) {
	now := time.Now()
	if into := now.Sub(now.Truncate(time.Minute)); into > 40*time.Second {
		time.Sleep(time.Minute - into + 200*time.Millisecond)
		now = time.Now()
	}
	if sc.perSecond {
		time.Sleep(now.Truncate(time.Second).Add(time.Second + 20*time.Millisecond).Sub(now))
	}
}

// phase turns a duration until reset, reported for a request sent at sent,
// into the second of the minute at which it ends: the servers under test run
// one after the other, so the same window end is compared, not the same
// count down ("~S", S in 0..59; equal allows one second either way).
func phase(sent time.Time, d time.Duration) string {
	end := sent.Add(d).Round(time.Second)
	return "~" + strconv.FormatInt(end.Unix()%60, 10)
}

func normalize(resp *rlsv3.RateLimitResponse, err error, sent time.Time) map[string]string {
	f := map[string]string{}
	if err != nil {
		f["error"] = status.Code(err).String()
		return f
	}
	f["overall"] = resp.OverallCode.String()
	f["statuses"] = strconv.Itoa(len(resp.Statuses))
	for i, st := range resp.Statuses {
		p := fmt.Sprintf("status[%d].", i)
		f[p+"code"] = st.Code.String()
		if cl := st.CurrentLimit; cl != nil {
			f[p+"limit"] = fmt.Sprintf("%d/%s name=%q x%d", cl.RequestsPerUnit, cl.Unit, cl.Name, cl.GetUnitMultiplier().GetValue())
		} else {
			f[p+"limit"] = "none"
		}
		f[p+"remaining"] = strconv.FormatUint(uint64(st.LimitRemaining), 10)
		if d := st.DurationUntilReset; d != nil {
			f[p+"reset"] = phase(sent, d.AsDuration())
		} else {
			f[p+"reset"] = "none"
		}
	}
	var hs []string
	for _, h := range resp.ResponseHeadersToAdd {
		v := h.Value
		if strings.EqualFold(h.Key, "Retry-After") {
			f["ext.retry-after"] = "present" // an extension: see extensions
			continue
		}
		if strings.EqualFold(h.Key, "RateLimit-Reset") {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				v = phase(sent, time.Duration(n)*time.Second)
			}
		}
		// Each header is a field of its own, so that a reset time is
		// compared as one (one second either way, see equal) rather than
		// as part of one string of every header.
		hs = append(hs, h.Key)
		f["header."+h.Key] = v
	}
	sort.Strings(hs)
	f["headers"] = strings.Join(hs, ",")
	if md := resp.DynamicMetadata; md != nil && md.Fields["envoy_rls"] != nil {
		f["ext.envoy_rls"] = "present" // an extension: see extensions
		md = proto.Clone(md).(*structpb.Struct)
		delete(md.Fields, "envoy_rls")
		if len(md.Fields) == 0 {
			md = nil
		}
		resp = &rlsv3.RateLimitResponse{DynamicMetadata: md}
	}
	if resp.DynamicMetadata != nil {
		b, _ := protojson.MarshalOptions{}.Marshal(resp.DynamicMetadata)
		// protojson and prototext vary their spacing on purpose.
		f["metadata"] = strings.Join(strings.Fields(string(b)), "")
	} else {
		f["metadata"] = "none"
	}
	return f
}

// extensions is the reason of differences that are only additions the
// reference does not make: Retry-After on OVER_LIMIT answers and the
// denying rule under dynamic_metadata.envoy_rls (README: "Telling the
// client and the operator what happened").
const extensions = "extension: Retry-After and dynamic_metadata.envoy_rls on OVER_LIMIT answers"

// equal compares two field values; "~S" values (the second of the minute
// a window ends, see phase) may differ by one, around the minute too.
func equal(a, b string) bool {
	if a == b {
		return true
	}
	if strings.HasPrefix(a, "~") && strings.HasPrefix(b, "~") {
		x, err1 := strconv.ParseInt(a[1:], 10, 64)
		y, err2 := strconv.ParseInt(b[1:], 10, 64)
		d := ((x-y)%60 + 60) % 60
		return err1 == nil && err2 == nil && (d <= 1 || d == 59)
	}
	return false
}

func compare(out io.Writer, sc *scenario, name string, ref, got []result, verbose bool) tally {
	var t tally
	for i := range sc.steps {
		if ref[i].skipped || got[i].skipped {
			continue
		}
		var diffs []string
		keys := map[string]bool{}
		for k := range ref[i].fields {
			keys[k] = true
		}
		for k := range got[i].fields {
			keys[k] = true
		}
		var sorted []string
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		if r, g := ref[i].fields["error"], got[i].fields["error"]; r != g {
			sorted = []string{"error"} // the rest follows from it
		}
		for _, k := range sorted {
			r, ok1 := ref[i].fields[k]
			g, ok2 := got[i].fields[k]
			if !ok1 || !ok2 || !equal(r, g) {
				diffs = append(diffs, fmt.Sprintf("%s: reference %q, envoy-rls %q", k, r, g))
			}
		}
		st := sc.steps[i]
		label := fmt.Sprintf("%s step %d (%s) on %s", sc.name, i, st.describe(), name)
		onlyExt := len(diffs) > 0
		for _, d := range diffs {
			onlyExt = onlyExt && strings.HasPrefix(d, "ext.")
		}
		if onlyExt && st.intended == "" {
			st.intended = extensions
		}
		switch {
		case len(diffs) == 0:
			t.identical++
			if verbose {
				fmt.Fprintf(out, "identical   %s\n", label)
			}
		case st.intended != "":
			t.intended++
			fmt.Fprintf(out, "INTENDED    %s: %s\n              %s\n", label, st.intended, strings.Join(diffs, "\n              "))
		default:
			t.unintended++
			fmt.Fprintf(out, "UNINTENDED  %s\n              %s\n", label, strings.Join(diffs, "\n              "))
		}
	}
	return t
}
