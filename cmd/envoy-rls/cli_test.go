package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// testCommand defines a few flags of each kind.
func testCommand() (*command, *struct {
	d time.Duration
	b bool
	n int
	s string
}) {
	v := &struct {
		d time.Duration
		b bool
		n int
		s string
	}{}
	c := newCommand("serve", "  envoy-rls serve [flags]", true)
	c.fs.DurationVar(&v.d, "backend-timeout", 10*time.Millisecond, "longest wait")
	c.fs.BoolVar(&v.b, "watch-config", true, "reload")
	c.fs.IntVar(&v.n, "max-keys", 5, "most keys")
	c.fs.StringVar(&v.s, "config", "", "the config")
	return c, v
}

func TestCommandMessages(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"--backend-timeout", "abc"}, want: `--backend-timeout "abc": want a Go duration such as 250ms, 1.5s or 2m (a number with a unit: ns, us, ms, s, m, h)`},
		{args: []string{"-backend-timeout=5"}, want: `--backend-timeout "5": want a Go duration such as 250ms, 1.5s or 2m (a number with a unit: ns, us, ms, s, m, h)`},
		{env: map[string]string{"ENVOY_RLS_BACKEND_TIMEOUT": "abc"}, want: `ENVOY_RLS_BACKEND_TIMEOUT="abc" (--backend-timeout): want a Go duration such as 250ms, 1.5s or 2m (a number with a unit: ns, us, ms, s, m, h)`},
		{args: []string{"--watch-config=maybe"}, want: `--watch-config "maybe": want true or false`},
		{env: map[string]string{"ENVOY_RLS_WATCH_CONFIG": "maybe"}, want: `ENVOY_RLS_WATCH_CONFIG="maybe" (--watch-config): want true or false`},
		{args: []string{"--max-keys", "lots"}, want: `--max-keys "lots": want a whole number`},
		{args: []string{"--max-keys", "99999999999999999999"}, want: `--max-keys "99999999999999999999": out of range`},
		{args: []string{"--bakend-timeout", "1s"}, want: `unknown flag --bakend-timeout (did you mean --backend-timeout?)`},
		{args: []string{"-max"}, want: `unknown flag --max (did you mean --max-keys?)`},
		{args: []string{"--zzz"}, want: `unknown flag --zzz`},
		{args: []string{"--config"}, want: `--config needs a value`},
		{args: []string{"ratelimit.yaml"}, want: `unexpected argument "ratelimit.yaml" (did you mean --config ratelimit.yaml?)`},
		{args: []string{"--config", "a.yaml", "b.yaml"}, want: `unexpected argument "b.yaml" (flags go before it, spelled --name)`},
		// Both a bad flag and a bad variable: the command line is read
		// first and stops at its first error.
		{args: []string{"--max-keys", "x"}, env: map[string]string{"ENVOY_RLS_BACKEND_TIMEOUT": "abc"}, want: `--max-keys "x": want a whole number`},
		// Every bad variable is reported.
		{env: map[string]string{"ENVOY_RLS_BACKEND_TIMEOUT": "abc", "ENVOY_RLS_MAX_KEYS": "x"}, want: "ENVOY_RLS_BACKEND_TIMEOUT=\"abc\" (--backend-timeout): want a Go duration such as 250ms, 1.5s or 2m (a number with a unit: ns, us, ms, s, m, h)\nENVOY_RLS_MAX_KEYS=\"x\" (--max-keys): want a whole number"},
	} {
		t.Run("", func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			c, _ := testCommand()
			err := c.parse(tc.args)
			if err == nil || err.Error() != tc.want {
				t.Errorf("%v %v:\n got  %v\n want %s", tc.args, tc.env, err, tc.want)
			}
		})
	}
}

func TestCommandSources(t *testing.T) {
	t.Setenv("ENVOY_RLS_MAX_KEYS", "7")
	t.Setenv("ENVOY_RLS_BACKEND_TIMEOUT", "3s")
	c, v := testCommand()
	if err := c.parse([]string{"--backend-timeout", "250ms"}); err != nil {
		t.Fatal(err)
	}
	// The command line wins over the environment.
	if v.d != 250*time.Millisecond || v.n != 7 || !v.b {
		t.Fatalf("values %+v", *v)
	}
	if got := c.source("max-keys"); got != "ENVOY_RLS_MAX_KEYS (--max-keys)" {
		t.Errorf("source of an environment value: %q", got)
	}
	if got := c.value("max-keys", "7"); got != `ENVOY_RLS_MAX_KEYS="7" (--max-keys)` {
		t.Errorf("value from the environment: %q", got)
	}
	if got := c.source("backend-timeout"); got != "--backend-timeout" {
		t.Errorf("source of a flag: %q", got)
	}
	if got := c.value("config", "x"); got != `--config "x"` {
		t.Errorf("value of a default: %q", got)
	}
	if !c.given("max-keys") || !c.given("backend-timeout") || c.given("config") || c.given("watch-config") {
		t.Errorf("given: %v", c.from)
	}
}

func TestCommandHelp(t *testing.T) {
	for _, arg := range []string{"-h", "--help", "-help"} {
		c, _ := testCommand()
		if err := c.parse([]string{arg}); !errors.Is(err, errHelp) {
			t.Fatalf("%s: %v", arg, err)
		}
	}
	c, _ := testCommand()
	var out bytes.Buffer
	c.usage(&out)
	want := `Usage:
  envoy-rls serve [flags]

Flags:
  --backend-timeout (env ENVOY_RLS_BACKEND_TIMEOUT), default "10ms"
      longest wait
  --config (env ENVOY_RLS_CONFIG)
      the config
  --max-keys (env ENVOY_RLS_MAX_KEYS), default "5"
      most keys
  --watch-config (env ENVOY_RLS_WATCH_CONFIG), default "true"
      reload
`
	if out.String() != want {
		t.Fatalf("usage:\n%s\nwant:\n%s", out.String(), want)
	}
	if h := c.hint(); h != `Run "envoy-rls serve -h" for usage.` || strings.Contains(h, "\n") {
		t.Fatalf("hint %q", h)
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"a", "", 1}, {"backend", "bakend", 1}, {"kitten", "sitting", 3}, {"abc", "cba", 2}} {
		if d := editDistance(tc.a, tc.b); d != tc.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, d, tc.d)
		}
	}
}

func TestUnknownEnvironmentVariablesAreNamed(t *testing.T) {
	c := newCommand("serve", "", true)
	var backend, grpcAddr string
	c.fs.StringVar(&backend, "backend", "", "")
	c.fs.StringVar(&grpcAddr, "grpc-addr", "", "")
	got := c.unknownEnv([]string{
		"ENVOY_RLS_BAKEND=redis",          // misspelt: named, with the nearest
		"ENVOY_RLS_BACKEND=memory",        // a flag's variable
		"ENVOY_RLS_FROBNICATE=1",          // unknown, nothing near
		"ENVOY_RLS_SERVICE_HOST=10.0.0.1", // Kubernetes service links
		"ENVOY_RLS_SERVICE_PORT_GRPC=8081",
		"ENVOY_RLS_PORT=tcp://10.0.0.1:8081",
		"ENVOY_RLS_PORT_8081_TCP_ADDR=10.0.0.1",
		"PATH=/bin",
	})
	want := []string{
		"ENVOY_RLS_BAKEND is set but names no flag of serve; it is ignored (did you mean ENVOY_RLS_BACKEND?)",
		"ENVOY_RLS_FROBNICATE is set but names no flag of serve; it is ignored",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("unknownEnv = %q, want %q", got, want)
	}
}
