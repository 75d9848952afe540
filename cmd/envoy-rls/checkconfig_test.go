package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// configDirLayout writes a config directory as Kubernetes mounts a
// ConfigMap (keys as links through ..data to a timestamped directory, one
// key without an extension) beside a YAML file, an extensionless file, a
// dotfile, a subdirectory, a link to it and a named pipe.
func configDirLayout(t *testing.T, dir string) {
	t.Helper()
	domain := func(name string) string {
		return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n", name)
	}
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, rel string) {
		t.Helper()
		if err := os.Symlink(target, filepath.Join(dir, rel)); err != nil {
			t.Fatal(err)
		}
	}
	write("b.yaml", domain("b"))
	write("limits", domain("a"))
	write(".hidden.yaml", domain("h"))
	write("sub/e.yaml", domain("e"))
	const ts = "..2026_12_03_10_00_00.123456789"
	write(ts+"/cm.yaml", domain("d"))
	write(ts+"/cmx", domain("x"))
	link(ts, "..data")
	link("..data/cm.yaml", "cm.yaml")
	link("..data/cmx", "cmx")
	link("sub", "dirlink")
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
}

var validLine = regexp.MustCompile(`: valid \((\d+) domains\)`)

// runCheck runs check-config with args and returns its stdout and the
// domains it found valid.
func runCheck(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(append([]string{"check-config"}, args...), &stdout, &stderr); code != 0 {
		t.Fatalf("check-config %v: exit %d\n%s%s", args, code, stdout.String(), stderr.String())
	}
	m := validLine.FindStringSubmatch(stdout.String())
	if m == nil {
		t.Fatalf("check-config %v: no valid line in\n%s", args, stdout.String())
	}
	n, _ := strconv.Atoi(m[1])
	return stdout.String(), n
}

// servedDomains builds serve with args (the environment of withEnv) and
// returns how many domains it loaded.
func servedDomains(t *testing.T, args ...string) int {
	t.Helper()
	o, err := parseServe(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := build(context.Background(), o, io.Discard)
	if s != nil {
		defer s.close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return len(s.svc.Config().Domains())
}

// check-config reads a directory as serve does: natively, with the
// reference's file selection flags, and under the reference's environment
// (no --config), it finds as many domains as serve loads, and names every
// entry it skips and why.
func TestCheckConfigReadsADirectoryAsServeDoes(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "rl", "config")
	configDirLayout(t, dir)
	withEnv(t, nil)
	free := testutil.FreeAddr(t)

	out, n := runCheck(t, "--config", dir)
	if served := servedDomains(t, "--config", dir, "--grpc-addr", free, "--http-addr", ""); n != served || n != 2 {
		t.Errorf("native: check-config found %d domains, serve loaded %d, want 2 (b.yaml, cm.yaml)\n%s", n, served, out)
	}
	for _, want := range []string{
		"/limits: skipped: not *.yaml or *.yml (--config-all-files reads it)",
		"/cmx: skipped: not *.yaml or *.yml (--config-all-files reads it)",
		"/.hidden.yaml: skipped: name starts with \".\" (--config-dotfiles reads it)",
		"/sub: skipped: a subdirectory (--config-recursive reads it)",
		"/..data: skipped: Kubernetes' atomic writer entry",
		"/..2026_12_03_10_00_00.123456789: skipped: Kubernetes' atomic writer entry",
		"/pipe.yaml: skipped: not a regular file",
	} {
		if !strings.Contains(out, dir+want) {
			t.Errorf("native: no %q in\n%s", dir+want, out)
		}
	}

	args := []string{"--config", dir, "--config-all-files", "--config-recursive"}
	out, n = runCheck(t, args...)
	if served := servedDomains(t, append(args, "--grpc-addr", free, "--http-addr", "")...); n != served || n != 5 {
		t.Errorf("all files, recursive: check-config found %d domains, serve loaded %d, want 5\n%s", n, served, out)
	}
	if !strings.Contains(out, dir+"/dirlink: skipped: a link to a directory (not followed)") {
		t.Errorf("all files: the link to a directory not named in\n%s", out)
	}

	// The reference's environment: every file, subdirectories and
	// dotfiles (RUNTIME_IGNOREDOTFILES unset), as serve reads it.
	port := func() string { return strconv.Itoa(testutil.FreePort(t)) }
	withEnv(t, map[string]string{
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "rl", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "127.0.0.1:1",
		"HOST": "127.0.0.1", "PORT": port(), "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": port(), "GRPC_HOST": "127.0.0.1", "GRPC_PORT": port(),
	})
	out, n = runCheck(t)
	if served := servedDomains(t); n != served || n != 6 {
		t.Errorf("reference environment: check-config found %d domains, serve loaded %d, want 6\n%s", n, served, out)
	}
	if want := "no --config: reading " + dir + " as serve does under the reference server's environment (RUNTIME_ROOT, RUNTIME_SUBDIRECTORY)"; !strings.Contains(out, want) {
		t.Errorf("reference environment: no %q in\n%s", want, out)
	}
	if strings.Contains(out, "/limits: skipped") || strings.Contains(out, "/.hidden.yaml: skipped") {
		t.Errorf("reference environment: skipped what serve reads:\n%s", out)
	}
}
