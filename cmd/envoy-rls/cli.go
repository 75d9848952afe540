package main

import (
	"encoding"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// command parses the flags of one subcommand and their environment
// variables, with messages that say what to do: flags are spelled --name,
// a bad value names the format wanted and where the value came from (the
// flag or its variable), and an unknown flag suggests the nearest one.
// Help goes to the caller's stdout, errors to stderr with a one-line hint
// instead of the full flag list.
type command struct {
	name     string // "serve"
	synopsis string // usage line(s) after "Usage:"
	fs       *flag.FlagSet
	// env is whether the flags can also be set with ENVOY_RLS_* variables.
	env bool
	// from records where each flag given was set: "--name" or the
	// variable's name.
	from map[string]string
	// bad is the last value a flag refused, for the error message.
	bad *valueError
	// sections are the help's topics in the order they were first named,
	// each with its flags in the order they were defined.
	sections []*section
	// deprecated holds, by flag name, what to do instead of giving a
	// deprecated flag.
	deprecated map[string]string
}

// section is one topic of a command's help.
type section struct {
	title string
	flags []string
}

// newCommand returns a command whose flag set is ready for definitions.
func newCommand(name, synopsis string, env bool) *command {
	c := &command{name: name, synopsis: synopsis, env: env, from: map[string]string{}}
	c.fs = flag.NewFlagSet(name, flag.ContinueOnError)
	// The flag package's own messages spell flags with one dash and print
	// every flag after any mistake: it stays quiet, parse() speaks.
	c.fs.SetOutput(io.Discard)
	c.fs.Usage = func() {}
	return c
}

// flagSet defines flags of a command under one topic of its help: the
// flags defined through it are listed under the topic's title, in the order
// they are defined. Its methods are the flag package's.
type flagSet struct {
	*flag.FlagSet
	c *command
	s *section
}

// section returns the flag set of the help topic title, which is listed
// after the topics named before it.
func (c *command) section(title string) *flagSet {
	for _, s := range c.sections {
		if s.title == title {
			return &flagSet{FlagSet: c.fs, c: c, s: s}
		}
	}
	s := &section{title: title}
	c.sections = append(c.sections, s)
	return &flagSet{FlagSet: c.fs, c: c, s: s}
}

func (f *flagSet) add(name string) { f.s.flags = append(f.s.flags, name) }

// deprecate marks flag name deprecated; advice says what to do instead.
func (f *flagSet) deprecate(name, advice string) {
	if f.c.deprecated == nil {
		f.c.deprecated = map[string]string{}
	}
	f.c.deprecated[name] = advice
}

// deprecatedUse lists, one message each, the deprecated flags given on the
// command line or as ENVOY_RLS_* variables, but not those skip names.
func (c *command) deprecatedUse(skip func(name string) bool) []string {
	var out []string
	c.fs.VisitAll(func(f *flag.Flag) {
		advice, ok := c.deprecated[f.Name]
		if ok && c.given(f.Name) && !skip(f.Name) {
			out = append(out, fmt.Sprintf("%s is deprecated: %s", c.source(f.Name), advice))
		}
	})
	return out
}

func (f *flagSet) StringVar(p *string, name, value, usage string) {
	f.FlagSet.StringVar(p, name, value, usage)
	f.add(name)
}

func (f *flagSet) BoolVar(p *bool, name string, value bool, usage string) {
	f.FlagSet.BoolVar(p, name, value, usage)
	f.add(name)
}

func (f *flagSet) IntVar(p *int, name string, value int, usage string) {
	f.FlagSet.IntVar(p, name, value, usage)
	f.add(name)
}

func (f *flagSet) Int64Var(p *int64, name string, value int64, usage string) {
	f.FlagSet.Int64Var(p, name, value, usage)
	f.add(name)
}

func (f *flagSet) UintVar(p *uint, name string, value uint, usage string) {
	f.FlagSet.UintVar(p, name, value, usage)
	f.add(name)
}

func (f *flagSet) Uint64Var(p *uint64, name string, value uint64, usage string) {
	f.FlagSet.Uint64Var(p, name, value, usage)
	f.add(name)
}

func (f *flagSet) Float64Var(p *float64, name string, value float64, usage string) {
	f.FlagSet.Float64Var(p, name, value, usage)
	f.add(name)
}

func (f *flagSet) DurationVar(p *time.Duration, name string, value time.Duration, usage string) {
	f.FlagSet.DurationVar(p, name, value, usage)
	f.add(name)
}

func (f *flagSet) TextVar(p encoding.TextUnmarshaler, name string, value encoding.TextMarshaler, usage string) {
	f.FlagSet.TextVar(p, name, value, usage)
	f.add(name)
}

func (f *flagSet) Var(value flag.Value, name string, usage string) {
	f.FlagSet.Var(value, name, usage)
	f.add(name)
}

// valueError is a value a flag refused.
type valueError struct {
	name, value, source string
	kind                any // the flag's Get() value before the failed Set
	err                 error
}

func (e *valueError) Error() string {
	if strings.HasPrefix(e.source, "--") {
		return fmt.Sprintf("%s %q: %s", e.source, e.value, wantFormat(e.kind, e.err))
	}
	return fmt.Sprintf("%s=%q (--%s): %s", e.source, e.value, e.name, wantFormat(e.kind, e.err))
}

// wantFormat says what a value of a flag of this kind must look like.
func wantFormat(kind any, err error) string {
	switch kind.(type) {
	case time.Duration:
		return "want a Go duration such as 250ms, 1.5s or 2m (a number with a unit: ns, us, ms, s, m, h)"
	case bool:
		return "want true or false"
	case int, int64, uint, uint64:
		if strings.Contains(err.Error(), "range") {
			return "out of range"
		}
		return "want a whole number"
	case float64:
		return "want a number"
	}
	return err.Error()
}

// checkedValue records the value its flag refuses.
type checkedValue struct {
	flag.Value
	name string
	c    *command
	// source is where the value being set comes from.
	source string
}

func (v *checkedValue) Set(s string) error {
	var kind any
	if g, ok := v.Value.(flag.Getter); ok {
		kind = g.Get()
	}
	if err := v.Value.Set(s); err != nil {
		v.c.bad = &valueError{name: v.name, value: s, source: v.source, kind: kind, err: err}
		return err
	}
	v.c.from[v.name] = v.source
	return nil
}

func (v *checkedValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func (v *checkedValue) Get() any {
	if g, ok := v.Value.(flag.Getter); ok {
		return g.Get()
	}
	return v.Value.String()
}

// parse parses args and then, for every flag not given, its environment
// variable. It returns errHelp for -h/--help.
func (c *command) parse(args []string) error {
	c.fs.VisitAll(func(f *flag.Flag) {
		if _, ok := f.Value.(*checkedValue); !ok {
			f.Value = &checkedValue{Value: f.Value, name: f.Name, c: c, source: "--" + f.Name}
		}
	})
	if err := c.fs.Parse(args); err != nil {
		return c.flagError(err)
	}
	if c.fs.NArg() > 0 {
		arg := c.fs.Arg(0)
		if c.fs.Lookup("config") != nil && c.from["config"] == "" && !strings.HasPrefix(arg, "-") {
			return fmt.Errorf("unexpected argument %q (did you mean --config %s?)", arg, arg)
		}
		return fmt.Errorf("unexpected argument %q (flags go before it, spelled --name)", arg)
	}
	if !c.env {
		return nil
	}
	var errs []error
	c.fs.VisitAll(func(f *flag.Flag) {
		if c.from[f.Name] != "" {
			return
		}
		name := envName(f.Name)
		v, ok := os.LookupEnv(name)
		if !ok {
			return
		}
		cv := f.Value.(*checkedValue)
		cv.source = name
		// Through the flag set, so that it counts the flag as set.
		if err := c.fs.Set(f.Name, v); err != nil {
			errs = append(errs, c.bad)
		}
		cv.source = "--" + f.Name
	})
	return errors.Join(errs...)
}

// flagError rewrites an error of the flag package.
func (c *command) flagError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return errHelp
	}
	msg := err.Error()
	if c.bad != nil && strings.HasPrefix(msg, "invalid ") {
		return c.bad
	}
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		name = strings.TrimLeft(name, "-")
		if near := c.nearest(name); near != "" {
			return fmt.Errorf("unknown flag --%s (did you mean --%s?)", name, near)
		}
		return fmt.Errorf("unknown flag --%s", name)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
		return fmt.Errorf("--%s needs a value", strings.TrimLeft(name, "-"))
	}
	return err
}

// nearest returns the defined flag closest to name (a prefix of it, or at
// most two edits away), or "".
func (c *command) nearest(name string) string {
	best, bestDist := "", 3
	c.fs.VisitAll(func(f *flag.Flag) {
		d := editDistance(name, f.Name)
		if strings.HasPrefix(f.Name, name) && len(name) >= 3 {
			d = min(d, 1)
		}
		if d < bestDist {
			best, bestDist = f.Name, d
		}
	})
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// source returns how to name a flag in a message: "--name", or its
// variable when the value came from the environment.
func (c *command) source(name string) string {
	if s := c.from[name]; s != "" && s != "--"+name {
		return s + " (--" + name + ")"
	}
	return "--" + name
}

// value names a flag's value in a message: `--name "v"`, or
// `VARIABLE="v" (--name)` when it came from the environment.
func (c *command) value(name, v string) string {
	if s := c.from[name]; s != "" && s != "--"+name {
		return fmt.Sprintf("%s=%q (--%s)", s, v, name)
	}
	return fmt.Sprintf("--%s %q", name, v)
}

// given reports whether a flag was set, on the command line or in the
// environment.
func (c *command) given(name string) bool { return c.from[name] != "" }

// hint is the line printed after an error instead of the flag list.
func (c *command) hint() string {
	return fmt.Sprintf("Run \"envoy-rls %s -h\" for usage.", c.name)
}

// usage writes the full help: the synopsis and every flag with its
// variable and default, by topic (flags defined outside any topic last).
func (c *command) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage:\n%s\n", c.synopsis)
	for _, s := range c.helpSections() {
		fmt.Fprintf(w, "\n%s:\n", s.title)
		for _, name := range s.flags {
			f := c.fs.Lookup(name)
			line := "  --" + f.Name
			if c.env {
				line += " (env " + envName(f.Name) + ")"
			}
			if f.DefValue != "" {
				line += ", default " + strconv.Quote(f.DefValue)
			}
			fmt.Fprintf(w, "%s\n      %s\n", line, f.Usage)
		}
	}
}

// helpSections are the help's topics that have flags, then the flags
// defined outside any ("Flags" when there is no topic, else "Other flags"),
// by name.
func (c *command) helpSections() []*section {
	var out []*section
	inSection := map[string]bool{}
	for _, s := range c.sections {
		if len(s.flags) > 0 {
			out = append(out, s)
		}
		for _, f := range s.flags {
			inSection[f] = true
		}
	}
	rest := &section{title: "Flags"}
	if len(c.sections) > 0 {
		rest.title = "Other flags"
	}
	c.fs.VisitAll(func(f *flag.Flag) {
		if !inSection[f.Name] {
			rest.flags = append(rest.flags, f.Name)
		}
	})
	if len(rest.flags) > 0 {
		out = append(out, rest)
	}
	return out
}

// markdown writes every flag of c as Markdown tables (flag, environment
// variable, default, meaning), one per topic of the help under a heading
// of its title (one table without a heading when c has no topics): the
// tables of docs/running.md, which TestFlagsDoc keeps
// equal to the definitions.
func (c *command) markdown(w io.Writer) {
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	code := func(s string) string {
		if s == "" {
			return ""
		}
		return "`" + cell(s) + "`"
	}
	for i, s := range c.helpSections() {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if len(c.sections) > 0 {
			fmt.Fprintf(w, "#### %s\n\n", s.title)
		}
		fmt.Fprintln(w, "| flag | environment | default | meaning |")
		fmt.Fprintln(w, "|---|---|---|---|")
		for _, name := range s.flags {
			f := c.fs.Lookup(name)
			env := ""
			if c.env {
				env = code(envName(f.Name))
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", code("--"+f.Name), env, code(f.DefValue), cell(f.Usage))
		}
	}
}

// unknownEnv lists, one message each, the ENVOY_RLS_* variables of environ
// that name no flag of c, so that a misspelt variable is not silently
// ignored. The variables Kubernetes injects for a Service named envoy-rls
// (ENVOY_RLS_SERVICE_HOST, ENVOY_RLS_SERVICE_PORT*, ENVOY_RLS_PORT*) are
// not listed.
func (c *command) unknownEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		rest, ok := strings.CutPrefix(name, "ENVOY_RLS_")
		if !ok || rest == "" || rest == "PORT" || strings.HasPrefix(rest, "PORT_") || strings.HasPrefix(rest, "SERVICE_") {
			continue
		}
		flagName := strings.ToLower(strings.ReplaceAll(rest, "_", "-"))
		if c.fs.Lookup(flagName) != nil {
			continue
		}
		msg := fmt.Sprintf("%s is set but names no flag of %s; it is ignored", name, c.name)
		if near := c.nearest(flagName); near != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", envName(near))
		}
		out = append(out, msg)
	}
	return out
}
