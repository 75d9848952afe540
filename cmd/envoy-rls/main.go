// Command envoy-rls is Envoy's external rate limit service.
//
//	envoy-rls serve --config PATH [--grpc-addr :8081] [--http-addr :8080] [flags]
//	envoy-rls check-config --config PATH
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

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		// As the reference server's /bin/ratelimit is started: no
		// arguments, configured by its environment (see refenv).
		args = []string{"serve"}
	}
	switch args[0] {
	case "serve":
		o, err := parseServe(args[1:], stderr)
		if err != nil {
			if errors.Is(err, errHelp) {
				return 0
			}
			fmt.Fprintln(stderr, "envoy-rls:", err)
			return 2
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := serve(ctx, o, stderr); err != nil {
			fmt.Fprintln(stderr, "envoy-rls:", err)
			return 1
		}
		return 0
	case "check-config":
		path, err := parseCheck(args[1:], stderr)
		if err != nil {
			if errors.Is(err, errHelp) {
				return 0
			}
			fmt.Fprintln(stderr, "envoy-rls:", err)
			return 2
		}
		return checkConfig(path, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "envoy-rls", version)
		return 0
	case "-h", "--help", "-help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "envoy-rls: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// checkConfig loads the config at path and prints every error as
// file:line: reason. It returns the process exit code.
func checkConfig(path string, stdout, stderr io.Writer) int {
	cfg, err := descriptors.Load(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: valid (%d domains)\n", path, len(cfg.Domains()))
	return 0
}
