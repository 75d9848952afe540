package deploy_test

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	"golang.org/x/mod/modfile"
)

// dockerfile is the parsed Dockerfile.
type dockerfile struct {
	stages   []instructions.Stage
	metaArgs []instructions.ArgCommand
}

func parseDockerfile() (*dockerfile, error) {
	raw, err := os.ReadFile(repoPath("Dockerfile"))
	if err != nil {
		return nil, err
	}
	res, err := parser.Parse(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("Dockerfile: %w", err)
	}
	stages, metaArgs, err := instructions.Parse(res.AST, nil)
	if err != nil {
		return nil, fmt.Errorf("Dockerfile: %w", err)
	}
	return &dockerfile{stages: stages, metaArgs: metaArgs}, nil
}

func (d *dockerfile) stage(name string) *instructions.Stage {
	for i := range d.stages {
		if d.stages[i].Name == name {
			return &d.stages[i]
		}
	}
	return nil
}

func (d *dockerfile) final() *instructions.Stage { return &d.stages[len(d.stages)-1] }

// commands returns the commands of type T in a stage, in order.
func commands[T any](s *instructions.Stage) []T {
	var out []T
	for _, c := range s.Commands {
		if v, ok := c.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// buildRun is one RUN of the build stage, split as the shell would.
type buildRun struct {
	env  []string // leading NAME=value words
	argv []string
}

// buildRuns splits the build stage's RUN commands into words, expanding the
// stage's ARGs (with overrides, as --build-arg would give them).
func (d *dockerfile) buildRuns(overrides map[string]string) ([]buildRun, error) {
	st := d.stage("build")
	if st == nil {
		return nil, fmt.Errorf("no stage named build")
	}
	vars := map[string]string{}
	var runs []buildRun
	lex := shell.NewLex('\\')
	for _, c := range st.Commands {
		switch c := c.(type) {
		case *instructions.ArgCommand:
			for _, kv := range c.Args {
				v := ""
				if kv.Value != nil {
					v = *kv.Value
				}
				if o, ok := overrides[kv.Key]; ok {
					v = o
				}
				vars[kv.Key] = v
			}
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				vars[kv.Key] = kv.Value
			}
		case *instructions.RunCommand:
			if !c.PrependShell || len(c.CmdLine) != 1 {
				return nil, fmt.Errorf("RUN %q: want the shell form", c.CmdLine)
			}
			var env []string
			for k, v := range vars {
				env = append(env, k+"="+v)
			}
			words, err := lex.ProcessWords(c.CmdLine[0], shell.EnvsFromSlice(env))
			if err != nil {
				return nil, fmt.Errorf("RUN %s: %w", c.CmdLine[0], err)
			}
			var r buildRun
			for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-") {
				r.env = append(r.env, words[0])
				words = words[1:]
			}
			r.argv = words
			runs = append(runs, r)
		}
	}
	return runs, nil
}

// goBuild returns the `go build` RUN of the build stage.
func goBuild(runs []buildRun) (buildRun, error) {
	var found []buildRun
	for _, r := range runs {
		if len(r.argv) >= 2 && r.argv[0] == "go" && r.argv[1] == "build" {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		return buildRun{}, fmt.Errorf("want exactly one `go build` RUN in the build stage, found %d", len(found))
	}
	return found[0], nil
}

// buildContext copies the repository as `docker build .` would send it: every
// file the .dockerignore does not exclude.
func buildContext(dst string) error {
	f, err := os.Open(repoPath(".dockerignore"))
	if err != nil {
		return err
	}
	patterns, err := ignorefile.ReadAll(f)
	f.Close()
	if err != nil {
		return err
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return err
	}
	return filepath.WalkDir(repoRoot, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(repoRoot, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if e.IsDir() {
			// A directory that is excluded and has no exception under it.
			if m, _ := pm.MatchesOrParentMatches(rel); m && !pm.Exclusions() {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if m, err := pm.MatchesOrParentMatches(rel); err != nil || m {
			return err
		}
		if !e.Type().IsRegular() {
			return nil
		}
		return copyFile(p, filepath.Join(dst, rel), 0o644)
	})
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// buildLikeDockerfile builds envoy-rls from a copy of the Docker build context
// with the Dockerfile's own build stage commands (`go ...` RUNs, in order),
// only the output path moved into a temporary directory. It returns the
// binary and the version it stamped.
func buildLikeDockerfile() (bin, version string, err error) {
	d, err := parseDockerfile()
	if err != nil {
		return "", "", err
	}
	version = fmt.Sprintf("v0.0.0-deploytest.%d", time.Now().UnixNano())
	runs, err := d.buildRuns(map[string]string{"VERSION": version})
	if err != nil {
		return "", "", err
	}
	ctxDir, err := os.MkdirTemp("", "envoy-rls-context-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(ctxDir)
	if err := buildContext(ctxDir); err != nil {
		return "", "", fmt.Errorf("build context: %w", err)
	}
	dir, err := buildDir()
	if err != nil {
		return "", "", err
	}
	bin = filepath.Join(dir, "envoy-rls")
	for _, r := range runs {
		if len(r.argv) == 0 || r.argv[0] != "go" {
			return "", "", fmt.Errorf("RUN %q: the test replays only `go` commands", r.argv)
		}
		argv := slices.Clone(r.argv)
		if i := slices.Index(argv, "-o"); i >= 0 && i+1 < len(argv) {
			argv[i+1] = bin
		}
		cmd := exec.Command("go", argv[1:]...)
		cmd.Dir = ctxDir
		cmd.Env = append(os.Environ(), r.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("%s %q: %v\n%s", strings.Join(r.env, " "), argv, err, out)
		}
	}
	if _, err := os.Stat(bin); err != nil {
		return "", "", fmt.Errorf("the build stage wrote no binary: %w", err)
	}
	return bin, version, nil
}

func TestDockerfile(t *testing.T) {
	d, err := parseDockerfile()
	if err != nil {
		t.Fatal(err)
	}
	if len(d.stages) != 2 {
		t.Fatalf("want 2 stages (build, final), got %d", len(d.stages))
	}
	build, final := d.stage("build"), d.final()
	if build == nil {
		t.Fatal("no stage named build")
	}

	// Pinned images: every FROM has a tag that is not latest (or is scratch).
	for _, s := range d.stages {
		img := s.BaseName
		if strings.Contains(img, "$") {
			t.Errorf("FROM %s: use a literal, pinned image", img)
		}
		if img == "scratch" {
			continue
		}
		name, tag, ok := strings.Cut(path.Base(img), ":")
		if !ok || tag == "" || tag == "latest" || strings.HasSuffix(tag, "-latest") {
			t.Errorf("FROM %s: pin a version tag", img)
		}
		// The Go image must be at least the go.mod version.
		if name == "golang" {
			mod, err := modfile.Parse("go.mod", readRepoFile(t, "go.mod"), nil)
			if err != nil {
				t.Fatal(err)
			}
			goVer, _, _ := strings.Cut(tag, "-")
			if cmpVersion(goVer, mod.Go.Version) < 0 {
				t.Errorf("FROM %s: go.mod needs Go %s", img, mod.Go.Version)
			}
		}
	}

	// Static, trimmed, version-stamped build of ./cmd/envoy-rls.
	runs, err := d.buildRuns(map[string]string{"VERSION": "X"})
	if err != nil {
		t.Fatal(err)
	}
	gb, err := goBuild(runs)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(gb.env, "CGO_ENABLED=0") {
		t.Errorf("go build without CGO_ENABLED=0: %q", gb.env)
	}
	if !slices.Contains(gb.argv, "-trimpath") {
		t.Errorf("go build without -trimpath: %q", gb.argv)
	}
	i := slices.Index(gb.argv, "-ldflags")
	if i < 0 || !strings.Contains(gb.argv[i+1], "-X main.version=X") {
		t.Errorf("go build does not stamp the version with -ldflags \"-X main.version=${VERSION}\": %q", gb.argv)
	}
	if gb.argv[len(gb.argv)-1] != "./cmd/envoy-rls" {
		t.Errorf("go build does not build ./cmd/envoy-rls: %q", gb.argv)
	}
	o := slices.Index(gb.argv, "-o")
	if o < 0 {
		t.Fatalf("go build has no -o: %q", gb.argv)
	}
	out := gb.argv[o+1]

	// The final stage: scratch (no shell, nothing but what is copied), the
	// CA certificates, the binary at both paths, uid 65534.
	if final.BaseName != "scratch" {
		t.Errorf("final stage FROM %s, want scratch", final.BaseName)
	}
	copies := map[string]string{} // destination -> source
	for _, c := range commands[*instructions.CopyCommand](final) {
		if c.From != build.Name {
			t.Errorf("COPY %v: only from the build stage", c.SourcePaths)
		}
		if len(c.SourcePaths) != 1 {
			t.Errorf("COPY %v: one source per COPY", c.SourcePaths)
			continue
		}
		copies[c.DestPath] = c.SourcePaths[0]
	}
	for _, dst := range []string{"/usr/local/bin/envoy-rls", "/bin/ratelimit"} {
		if copies[dst] != out {
			t.Errorf("the binary (%s) is not copied to %s: %v", out, dst, copies)
		}
	}
	if copies["/etc/ssl/certs/ca-certificates.crt"] != "/etc/ssl/certs/ca-certificates.crt" {
		t.Errorf("the CA certificates are not copied: %v", copies)
	}
	users := commands[*instructions.UserCommand](final)
	if len(users) != 1 || users[0].User != "65534:65534" {
		t.Errorf("final stage USER: want 65534:65534, got %v", users)
	}
	ep := commands[*instructions.EntrypointCommand](final)
	if len(ep) != 1 || ep[0].PrependShell || !slices.Equal(ep[0].CmdLine, []string{"/usr/local/bin/envoy-rls"}) {
		t.Errorf("ENTRYPOINT: want the exec form [\"/usr/local/bin/envoy-rls\"], got %+v", ep)
	}
	cmds := commands[*instructions.CmdCommand](final)
	if len(cmds) != 1 || cmds[0].PrependShell {
		t.Fatalf("CMD: want one, in exec form: %+v", cmds)
	}
	if commands[*instructions.EnvCommand](final) != nil {
		// An ENVOY_RLS_* default would win over the reference's variables
		// under Envoy Gateway, which runs /bin/ratelimit with no arguments.
		t.Errorf("the final stage sets ENV; keep settings out of the image")
	}

	// EXPOSE lists exactly the ports the binary listens on by default.
	defaults := flagDefaults(t)
	var exposed []int
	for _, e := range commands[*instructions.ExposeCommand](final) {
		for _, p := range e.Ports {
			n, err := strconv.Atoi(strings.TrimSuffix(p, "/tcp"))
			if err != nil {
				t.Fatalf("EXPOSE %s: %v", p, err)
			}
			exposed = append(exposed, n)
		}
	}
	want := []int{addrPort(t, defaults["grpc-addr"]), addrPort(t, defaults["http-addr"])}
	slices.Sort(exposed)
	slices.Sort(want)
	if !slices.Equal(exposed, want) {
		t.Errorf("EXPOSE %v, but envoy-rls listens on %v by default", exposed, want)
	}

	// The image's CMD runs: `serve` with flags the binary has, and the config
	// directory Kubernetes mounts the ConfigMap at.
	args := cmds[0].CmdLine
	if len(args) == 0 || args[0] != "serve" {
		t.Fatalf("CMD %q: want serve", args)
	}
	checkFlagsExist(t, "Dockerfile CMD", args[1:])
	if dir, _ := flagValue(args, "config"); dir != deploymentConfigDir(t) {
		t.Errorf("CMD --config %q, the Deployment mounts the config at %q", dir, deploymentConfigDir(t))
	}
}
