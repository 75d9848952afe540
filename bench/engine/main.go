// Command bench is the engine of `make bench` (bench/bench.sh builds the
// binaries and runs it). On one machine, in one run, it starts:
//
//   - floor: envoy-rls-floor, an RLS that answers OK without looking;
//   - memory: envoy-rls on the embedded store;
//   - redis: envoy-rls on a redis-server it starts itself;
//   - lease, approximate: the same with --consistency lease or approximate;
//   - reference: envoyproxy/ratelimit on its own redis-server, when
//     --ref-bin (REF_BIN) names a built binary;
//   - redis-b, when --systems names it: envoy-rls on its own redis-server
//     with --redis-b-bin and --redis-b-args (an A/B run beside redis);
//
// then drives each with the same load from envoy-rls-load, system after
// system in alternating rounds, and prints per scenario one table: the
// median over the rounds of every figure, and each figure's ratio to the
// floor's. Every process listens on 127.0.0.1 only and is stopped at the
// end.
//
// Figures per request: server CPU from /proc/<pid>/stat (user+system) over
// the round; Redis command time from INFO commandstats (the sum of usec of
// every command); Redis process CPU from INFO cpu (used_cpu_user +
// used_cpu_sys); Redis round trips from INFO stats total_reads_processed
// (the socket reads the server served: one per pipeline, however many
// commands it holds), the same measure for every system.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
)

type options struct {
	binDir      string
	refBin      string
	redisServer string
	rounds      int
	duration    time.Duration
	warmup      time.Duration
	concurrency int
	conns       int
	keys        []scenario
	systems     []string
	extraArgs   string
	binB        string // redis-b's envoy-rls (empty: the same binary)
	verbose     bool
	profileDir  string // non-empty: a CPU profile of every Go server after the rounds
	extraArgsB  string
}

func main() {
	o, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parse(args []string) (options, error) {
	var o options
	var keys, systems string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&o.binDir, "bin-dir", "bin", "directory holding envoy-rls, envoy-rls-floor and envoy-rls-load")
	fs.StringVar(&o.refBin, "ref-bin", os.Getenv("REF_BIN"), "built envoyproxy/ratelimit binary (empty: no reference)")
	fs.StringVar(&o.redisServer, "redis-server", "redis-server", "redis-server binary")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds per scenario (each system once per round); the median is the figure")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "load per system and round")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "load per system before the first round of a scenario (not measured)")
	fs.IntVar(&o.concurrency, "concurrency", 50, "concurrent gRPC callers")
	fs.IntVar(&o.conns, "conns", 4, "gRPC connections shared by the callers")
	fs.StringVar(&keys, "keys", "10000,zipf10000,1", "scenarios: distinct descriptor values (1 = one hot key; zipfN: N values drawn with Zipf s = 1.1, else in turn), comma-separated")
	fs.StringVar(&systems, "systems", "floor,memory,redis,lease,approximate,reference", "systems to run (reference only with --ref-bin; lease, approximate: redis with --consistency lease, approximate)")
	fs.StringVar(&o.extraArgs, "redis-args", "", "extra flags for envoy-rls on Redis, space-separated (e.g. --redis-batch-window=50us)")
	fs.StringVar(&o.binB, "redis-b-bin", "", "system redis-b (A/B runs): this envoy-rls binary on its own redis-server (empty: the same binary as redis)")
	fs.StringVar(&o.extraArgsB, "redis-b-args", "", "extra flags for redis-b, space-separated")
	fs.StringVar(&o.profileDir, "profile", "", "after each scenario's rounds, one more round per system (not counted) with a CPU profile of the server (floor, memory, redis, redis-b) written to this directory as <keys>-<system>.pprof")
	fs.BoolVar(&o.verbose, "v", false, "print every round's figures to stderr as it ends")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.rounds < 1 || o.duration <= 0 || o.concurrency < 1 || o.conns < 1 {
		return o, errors.New("--rounds, --duration, --concurrency and --conns must be positive")
	}
	for _, k := range strings.Split(keys, ",") {
		k = strings.TrimSpace(k)
		var sc scenario
		if rest, ok := strings.CutPrefix(k, "zipf"); ok {
			k, sc.zipf = rest, zipfS
		}
		n, err := strconv.Atoi(k)
		if err != nil || n < 1 {
			return o, fmt.Errorf("--keys: %q is not a positive number", k)
		}
		sc.keys = n
		o.keys = append(o.keys, sc)
	}
	for _, s := range strings.Split(systems, ",") {
		s = strings.TrimSpace(s)
		switch s {
		case "floor", "memory", "redis", "lease", "approximate", "redis-b":
		case "reference":
			if o.refBin == "" {
				continue
			}
		default:
			return o, fmt.Errorf("--systems: unknown system %q", s)
		}
		o.systems = append(o.systems, s)
	}
	if !slices.Contains(o.systems, "floor") {
		return o, errors.New("--systems must include floor: every ratio is to it")
	}
	return o, nil
}

// scenario is one load: keys descriptor values, asked in turn or, with
// zipf > 0, drawn from a Zipf distribution of that exponent.
type scenario struct {
	keys int
	zipf float64
}

// zipfS is the exponent of the zipfN scenarios: a quarter or so of the
// decisions of 10,000 keys fall on keys seen less than once per 100 ms.
const zipfS = 1.1

// id names the scenario in file names: 10000, zipf10000.
func (sc scenario) id() string {
	if sc.zipf > 0 {
		return "zipf" + strconv.Itoa(sc.keys)
	}
	return strconv.Itoa(sc.keys)
}

// system is one server under load, with its redis-server if it has one.
type system struct {
	name      string
	addr      string // gRPC
	debugAddr string // /debug/pprof/ (empty: none)
	cmd       *exec.Cmd
	redis     *redisProc
	notes     string
}

type redisProc struct {
	cmd    *exec.Cmd
	addr   string
	client *redis.Client
}

// sample is what one round measured on one system.
type sample struct {
	rps, p50, p99   float64 // calls/s, µs
	serverCPU       float64 // µs per request
	redisCmd        float64 // µs per request (commandstats)
	redisCPU        float64 // µs per request (process)
	redisTrips      float64 // reads per request
	scriptPerCall   float64 // µs per call of the script command, when there is one
	calls, errs     int64
	over            int64
	hasRedis        bool
	scriptName      string
	scriptCallsPerQ float64

	// Where the machine's CPU went, per request (see costs).
	loadCPU                 float64 // µs of envoy-rls-load's CPU
	reads, writes, switches float64 // the server's system calls and context switches
	idle, steal             float64 // share of the machine's CPU time idle, and taken by the hypervisor
}

const loadDomain = "bench"

// loadConfig is one descriptor with a limit no run reaches: every call is
// a full decision that allows (fixed window, the algorithm the reference
// has). The window is a minute: long beside the 100 ms of demand a lease
// chunk holds, as the limits lease is for are (a second-long window ends
// every chunk of a key seen a few times a second after a few requests).
const loadConfig = `domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
`

func run(o options, out io.Writer) error {
	work, err := os.MkdirTemp("", "envoy-rls-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	cfg := filepath.Join(work, "bench.yaml")
	if err := os.WriteFile(cfg, []byte(loadConfig), 0o644); err != nil {
		return err
	}
	// The reference reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml.
	refDir := filepath.Join(work, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(refDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(refDir, "bench.yaml"), []byte(loadConfig), 0o644); err != nil {
		return err
	}

	var systems []*system
	defer func() {
		for _, s := range systems {
			s.stop()
		}
	}()
	for _, name := range o.systems {
		s, err := start(o, name, work, cfg)
		if s != nil {
			systems = append(systems, s)
		}
		if err != nil {
			return fmt.Errorf("starting %s: %w", name, err)
		}
	}

	host, _ := os.Hostname()
	fmt.Fprintf(out, "make bench: %d rounds x %v per system, %d callers on %d connections, %d CPUs, host %s, %s\n",
		o.rounds, o.duration, o.concurrency, o.conns, numCPU(), host, time.Now().UTC().Format(time.RFC3339))
	for _, s := range systems {
		if s.notes != "" {
			fmt.Fprintf(out, "  %s: %s\n", s.name, s.notes)
		}
	}
	for _, keys := range o.keys {
		// Warm up: connections, Go runtime, Redis keys.
		for _, s := range systems {
			if _, err := drive(o, s, keys, o.warmup); err != nil {
				return err
			}
		}
		samples := map[string][]sample{}
		for r := 0; r < o.rounds; r++ {
			// Rotate the order so no system always runs first.
			for i := range systems {
				s := systems[(i+r)%len(systems)]
				sm, err := drive(o, s, keys, o.duration)
				if err != nil {
					return err
				}
				samples[s.name] = append(samples[s.name], sm)
				if o.verbose {
					fmt.Fprintf(os.Stderr, "round %d %-9s %8.0f req/s  server %5.1f µs/req  redis cpu %5.2f µs/req  trips %.3f/req  load %5.1f µs/req  idle %3.0f%%  syscalls %.3f/req  switches %.3f/req\n",
						r+1, s.name, sm.rps, sm.serverCPU, sm.redisCPU, sm.redisTrips, sm.loadCPU, 100*sm.idle, sm.reads+sm.writes, sm.switches)
				}
			}
		}
		report(out, o, keys, systems, samples)
		if o.profileDir != "" {
			if err := profileRound(o, out, systems, keys); err != nil {
				return err
			}
		}
	}
	return nil
}

// profileRound drives every system that has a profile endpoint once more
// for o.duration while taking a CPU profile of it (most of the round),
// written to o.profileDir as <keys>-<system>.pprof. It prints each
// round's calls and server CPU, by which to divide a profile's samples.
func profileRound(o options, out io.Writer, systems []*system, keys scenario) error {
	if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
		return err
	}
	secs := max(1, int((o.duration - time.Second).Seconds()))
	fmt.Fprintln(out)
	for _, s := range systems {
		if s.debugAddr == "" {
			continue
		}
		path := filepath.Join(o.profileDir, fmt.Sprintf("%s-%s.pprof", keys.id(), s.name))
		got := make(chan error, 1)
		go func() {
			got <- fetchProfile(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", s.debugAddr, secs), path)
		}()
		sm, err := drive(o, s, keys, o.duration)
		if err != nil {
			return err
		}
		if err := <-got; err != nil {
			return fmt.Errorf("profile of %s: %w", s.name, err)
		}
		fmt.Fprintf(out, "profile %s: %d calls in the round at %.0f calls/s, server CPU %.1f µs/call (the profile covers %ds of it)\n",
			path, sm.calls, sm.rps, sm.serverCPU, secs)
	}
	return nil
}

// drive runs envoy-rls-load against s for d and measures.
func drive(o options, s *system, keys scenario, d time.Duration) (sample, error) {
	var sm sample
	var rb redisSnap
	var err error
	if s.redis != nil {
		if rb, err = snapRedis(s.redis); err != nil {
			return sm, err
		}
	}
	before, err := snapProc(s.cmd.Process.Pid)
	if err != nil {
		return sm, err
	}
	load := exec.Command(filepath.Join(o.binDir, "envoy-rls-load"), "--addr", s.addr, "--domain", loadDomain,
		"--key", "user", "--keys", strconv.Itoa(keys.keys), "--zipf", strconv.FormatFloat(keys.zipf, 'g', -1, 64),
		"--concurrency", strconv.Itoa(o.concurrency),
		"--conns", strconv.Itoa(o.conns), "--duration", d.String(), "--requests", "1000000000")
	txt, err := load.CombinedOutput()
	if err != nil {
		return sm, fmt.Errorf("envoy-rls-load against %s: %v\n%s", s.name, err, txt)
	}
	after, err := snapProc(s.cmd.Process.Pid)
	if err != nil {
		return sm, err
	}
	if err := parseLoad(string(txt), &sm); err != nil {
		return sm, fmt.Errorf("%s: %w\n%s", s.name, err, txt)
	}
	if sm.errs > 0 || sm.over > 0 {
		return sm, fmt.Errorf("%s answered %d errors and %d denials; every call should be allowed:\n%s", s.name, sm.errs, sm.over, txt)
	}
	n := float64(sm.calls)
	sm.serverCPU = (after.cpu - before.cpu) / n
	ps := load.ProcessState
	sm.loadCPU = float64((ps.UserTime() + ps.SystemTime()).Microseconds()) / n
	sm.reads = (after.counts.reads - before.counts.reads) / n
	sm.writes = (after.counts.writes - before.counts.writes) / n
	sm.switches = (after.counts.switches - before.counts.switches) / n
	if t := after.total - before.total; t > 0 {
		sm.idle, sm.steal = (after.idle-before.idle)/t, (after.steal-before.steal)/t
	}
	if s.redis != nil {
		ra, err := snapRedis(s.redis)
		if err != nil {
			return sm, err
		}
		sm.hasRedis = true
		sm.redisCmd = (ra.cmdUsec - rb.cmdUsec) / n
		sm.redisCPU = (ra.cpuUsec - rb.cpuUsec) / n
		sm.redisTrips = (ra.reads - rb.reads) / n
		// The command that does the work: the one with the most time.
		var best float64
		for name, a := range ra.commands {
			b := rb.commands[name]
			if du := a[1] - b[1]; du > best && a[0] > b[0] {
				best = du
				sm.scriptName = name
				sm.scriptPerCall = du / (a[0] - b[0])
				sm.scriptCallsPerQ = (a[0] - b[0]) / n
			}
		}
	}
	return sm, nil
}

// parseLoad reads envoy-rls-load's report.
func parseLoad(txt string, sm *sample) error {
	var elapsed time.Duration
	found := 0
	for _, line := range strings.Split(txt, "\n") {
		switch {
		case strings.HasPrefix(line, "calls "):
			// calls N in D: R calls/s (ok A, over_limit B, errors C)
			var ok int64
			var d string
			if _, err := fmt.Sscanf(line, "calls %d in %s", &sm.calls, &d); err != nil {
				return fmt.Errorf("calls line: %v", err)
			}
			var err error
			if elapsed, err = time.ParseDuration(strings.TrimSuffix(d, ":")); err != nil {
				return err
			}
			i := strings.Index(line, "(ok ")
			if i < 0 {
				return errors.New("calls line without counts")
			}
			if _, err := fmt.Sscanf(line[i:], "(ok %d, over_limit %d, errors %d)", &ok, &sm.over, &sm.errs); err != nil {
				return fmt.Errorf("counts: %v", err)
			}
			found++
		case strings.HasPrefix(line, "latency "):
			var p50, p90, p99, mx string
			if _, err := fmt.Sscanf(line, "latency p50 %s p90 %s p99 %s max %s", &p50, &p90, &p99, &mx); err != nil {
				return fmt.Errorf("latency line: %v", err)
			}
			a, err1 := time.ParseDuration(p50)
			b, err2 := time.ParseDuration(p99)
			if err1 != nil || err2 != nil {
				return errors.New("latency line: bad durations")
			}
			sm.p50, sm.p99 = float64(a.Microseconds()), float64(b.Microseconds())
			found++
		}
	}
	if found != 2 || sm.calls == 0 || elapsed <= 0 {
		return errors.New("no calls or no latency in envoy-rls-load's report")
	}
	sm.rps = float64(sm.calls) / elapsed.Seconds()
	return nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func med(ss []sample, f func(sample) float64) float64 {
	xs := make([]float64, len(ss))
	for i, s := range ss {
		xs[i] = f(s)
	}
	return median(xs)
}

func spread(ss []sample, f func(sample) float64) (float64, float64) {
	lo, hi := f(ss[0]), f(ss[0])
	for _, s := range ss[1:] {
		lo, hi = min(lo, f(s)), max(hi, f(s))
	}
	return lo, hi
}

func report(out io.Writer, o options, keys scenario, systems []*system, samples map[string][]sample) {
	scenario := fmt.Sprintf("%d keys", keys.keys)
	switch {
	case keys.keys == 1:
		scenario = "one hot key"
	case keys.zipf > 0:
		scenario = fmt.Sprintf("%d keys drawn with Zipf s = %g", keys.keys, keys.zipf)
	}
	fmt.Fprintf(out, "\n%s, one fixed-window descriptor per call (median of %d rounds; x = ratio to the floor)\n\n", scenario, o.rounds)
	fl := samples["floor"]
	frps := med(fl, func(s sample) float64 { return s.rps })
	fp50 := med(fl, func(s sample) float64 { return s.p50 })
	fp99 := med(fl, func(s sample) float64 { return s.p99 })
	fcpu := med(fl, func(s sample) float64 { return s.serverCPU })
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "system\trequests/s\tp50 µs\tp99 µs\tserver CPU µs/req\tRedis cmd µs/req\tRedis CPU µs/req\tRedis round trips/req\tscript µs/call\trequests/s range\t")
	for _, s := range systems {
		ss := samples[s.name]
		rps := med(ss, func(s sample) float64 { return s.rps })
		p50 := med(ss, func(s sample) float64 { return s.p50 })
		p99 := med(ss, func(s sample) float64 { return s.p99 })
		cpu := med(ss, func(s sample) float64 { return s.serverCPU })
		lo, hi := spread(ss, func(s sample) float64 { return s.rps })
		redisCols := "-\t-\t-\t-\t"
		if ss[0].hasRedis {
			redisCols = fmt.Sprintf("%.1f\t%.1f\t%.3f\t%.1f (%s)\t",
				med(ss, func(s sample) float64 { return s.redisCmd }),
				med(ss, func(s sample) float64 { return s.redisCPU }),
				med(ss, func(s sample) float64 { return s.redisTrips }),
				med(ss, func(s sample) float64 { return s.scriptPerCall }), ss[0].scriptName)
		}
		fmt.Fprintf(tw, "%s\t%.0f (%.2fx)\t%.0f (%.2fx)\t%.0f (%.2fx)\t%.1f (%.2fx)\t%s%.0f–%.0f\t\n", s.name,
			rps, rps/frps, p50, p50/fp50, p99, p99/fp99, cpu, cpu/fcpu, redisCols, lo, hi)
	}
	_ = tw.Flush()
	costs(out, systems, samples)
}

// costs prints where the machine's CPU went per request, beside the table
// of report: the load generator's CPU (it shares the machine), the CPU of
// every process of the system together, how much of the machine stayed idle
// (when about the same for every system, requests/s follow the inverse of
// all processes' CPU per request) or was stolen by the hypervisor, and the
// server's read and write system calls and context switches per request.
func costs(out io.Writer, systems []*system, samples map[string][]sample) {
	fmt.Fprintf(out, "\nwhere the CPU went, per request (medians)\n\n")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "system\tload generator CPU µs\tall processes CPU µs\tmachine idle\tsteal\tserver reads\tserver writes\tserver context switches\t")
	for _, s := range systems {
		ss := samples[s.name]
		all := med(ss, func(s sample) float64 { return s.loadCPU + s.serverCPU + s.redisCPU })
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.0f%%\t%.0f%%\t%.3f\t%.3f\t%.3f\t\n", s.name,
			med(ss, func(s sample) float64 { return s.loadCPU }), all,
			100*med(ss, func(s sample) float64 { return s.idle }),
			100*med(ss, func(s sample) float64 { return s.steal }),
			med(ss, func(s sample) float64 { return s.reads }),
			med(ss, func(s sample) float64 { return s.writes }),
			med(ss, func(s sample) float64 { return s.switches }))
	}
	_ = tw.Flush()
}
