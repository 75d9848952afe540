// Command envoy-rls is Envoy's external rate limit service.
//
//	envoy-rls serve --config PATH [--grpc-addr :8081] [--http-addr :8080] [flags]
//	envoy-rls check-config --config PATH [--merge-domain-config] [file selection flags]
//
// Every flag can also be set with an environment variable: ENVOY_RLS_ and the
// flag's name in upper case with dashes as underscores (--grpc-addr is
// ENVOY_RLS_GRPC_ADDR). A flag given on the command line wins over the
// environment. `envoy-rls serve -h` lists them all.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `envoy-rls: Envoy's external rate limit service.

Usage:
  envoy-rls serve --config PATH [--grpc-addr :8081] [--http-addr :8080] [flags]
  envoy-rls check-config --config PATH
  envoy-rls version

Run "envoy-rls serve -h" for every flag and its environment variable.
`

// version is set at build time with -ldflags "-X main.version=...". When
// it is empty, `envoy-rls version` shows the module version Go recorded.
var version = ""

// commands are the subcommands, for suggestions.
var commands = []string{"serve", "check-config", "version", "help"}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		// As the reference server's /bin/ratelimit is started: no
		// arguments, configured by its environment (see refenv).
		args = []string{"serve"}
	}
	// fail prints err (one line per error) and where the help is.
	fail := func(cmd string, err error) int {
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "envoy-rls %s: %s\n", cmd, line)
		}
		fmt.Fprintf(stderr, "Run \"envoy-rls %s -h\" for usage.\n", cmd)
		return 2
	}
	switch args[0] {
	case "serve":
		o, err := parseServe(args[1:], stdout)
		if errors.Is(err, errHelp) {
			return 0
		}
		if err != nil {
			return fail("serve", err)
		}
		for _, w := range o.warnings(os.Environ()) {
			fmt.Fprintf(stderr, "envoy-rls serve: warning: %s\n", w)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := serve(ctx, o, stderr); err != nil {
			fmt.Fprintln(stderr, "envoy-rls:", err)
			return 1
		}
		return 0
	case "check-config":
		co, err := parseCheck(args[1:], stdout)
		if errors.Is(err, errHelp) {
			return 0
		}
		if err != nil {
			return fail("check-config", err)
		}
		return checkConfig(co, stdout, stderr)
	case "version", "--version", "-version":
		c := newCommand("version", "  envoy-rls version\n\nPrints the version of this binary: the one set with -ldflags \"-X main.version=...\" or\nrecorded by Go, the git commit it was built from, and the Go version.", false)
		if err := c.parse(args[1:]); errors.Is(err, errHelp) {
			c.usage(stdout)
			return 0
		} else if err != nil {
			return fail("version", err)
		}
		info, _ := debug.ReadBuildInfo()
		fmt.Fprintln(stdout, versionLine(version, info))
		return 0
	case "-h", "--help", "-help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	hint := ""
	for _, c := range commands {
		if editDistance(args[0], c) <= 2 {
			hint = " (did you mean " + c + "?)"
			break
		}
	}
	fmt.Fprintf(stderr, "envoy-rls: unknown command %q%s\nRun \"envoy-rls -h\" for usage.\n", args[0], hint)
	return 2
}

// checkConfig loads the config at co.path as serve would, and prints the
// files of a directory it skips and why, every error as file:line: reason,
// and with --config-lenient every warning as file:line: warning: reason.
// It returns the process exit code.
func checkConfig(co checkOptions, stdout, stderr io.Writer) int {
	path, lo := co.path, co.lo.descriptorOptions()
	if co.from != "" {
		fmt.Fprintf(stdout, "no --config: reading %s as serve does under the reference server's environment (%s)\n", path, co.from)
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		// The selection the loader makes (it calls the same function).
		if _, skipped, err := descriptors.SelectFiles(path, lo); err == nil {
			for _, sk := range skipped {
				fmt.Fprintf(stdout, "%s: skipped: %s%s\n", sk.Path, sk.Reason, co.readsIt(sk.Option))
			}
		}
	}
	cfg, err := descriptors.LoadWith(path, lo)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	for _, w := range cfg.Warnings() {
		e := *w
		e.Reason = "warning: " + e.Reason
		fmt.Fprintln(stderr, e.Error())
	}
	fmt.Fprintf(stdout, "%s: valid (%d domains)\n", path, len(cfg.Domains()))
	return 0
}

// readsIt names what would read a skipped file, after its reason: the
// flag of the descriptors.Options field option (none: "").
func (co checkOptions) readsIt(option string) string {
	flag := map[string]string{"Recursive": "--config-recursive", "AllFiles": "--config-all-files", "Dotfiles": "--config-dotfiles"}[option]
	switch {
	case flag == "":
		return ""
	case co.from != "" && option == "Dotfiles":
		return " (RUNTIME_IGNOREDOTFILES=false or " + flag + " reads it)"
	}
	return " (" + flag + " reads it)"
}
