package deploy_test

import (
	"bytes"
	"fmt"
	"os/exec"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"gopkg.in/yaml.v3"
)

// compose is the part of the Compose file format docker-compose.yml uses;
// anything else in the file is an error.
type compose struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Build *struct {
		Context    string            `yaml:"context"`
		Dockerfile string            `yaml:"dockerfile"`
		Args       map[string]string `yaml:"args"`
	} `yaml:"build"`
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	User        string            `yaml:"user"`
	ReadOnly    bool              `yaml:"read_only"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	DependsOn   []string          `yaml:"depends_on"`
	Environment map[string]string `yaml:"environment"`
}

func loadCompose(t *testing.T) compose {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(readRepoFile(t, "docker-compose.yml")))
	dec.KnownFields(true)
	var c compose
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

// mounts returns a service's volumes as container path -> host path.
func (s composeService) mounts(t *testing.T) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || !strings.HasPrefix(parts[0], "./") {
			t.Fatalf("volume %q: want ./host/path:/container/path[:ro]", v)
		}
		if len(parts) == 3 && parts[2] != "ro" {
			t.Errorf("volume %q: mount it read-only", v)
		}
		m[parts[1]] = strings.TrimPrefix(parts[0], "./")
	}
	return m
}

// containerPorts returns the container side of a service's published ports.
func (s composeService) containerPorts(t *testing.T) []int {
	t.Helper()
	var ps []int
	for _, p := range s.Ports {
		i := strings.LastIndex(p, ":")
		n, err := strconv.Atoi(p[i+1:])
		if err != nil {
			t.Fatalf("port %q: %v", p, err)
		}
		ps = append(ps, n)
	}
	slices.Sort(ps)
	return ps
}

func TestCompose(t *testing.T) {
	c := loadCompose(t)
	for _, name := range []string{"envoy-rls", "envoy", "app", "redis"} {
		if _, ok := c.Services[name]; !ok {
			t.Fatalf("docker-compose.yml has no service %s", name)
		}
	}
	for name, s := range c.Services {
		if s.Image == "" {
			t.Errorf("service %s has no image", name)
		} else if tag := imageTag(s.Image); tag == "" || strings.Contains(tag, "latest") {
			t.Errorf("service %s: image %s: pin a version tag", name, s.Image)
		}
		for _, dep := range s.DependsOn {
			if _, ok := c.Services[dep]; !ok {
				t.Errorf("service %s depends on unknown %s", name, dep)
			}
		}
	}

	// envoy-rls is built from the Dockerfile and run as the image runs.
	rls := c.Services["envoy-rls"]
	if rls.Build == nil || rls.Build.Context != "." || (rls.Build.Dockerfile != "" && rls.Build.Dockerfile != "Dockerfile") {
		t.Fatalf("envoy-rls must be built from ./Dockerfile")
	}
	d, err := parseDockerfile()
	if err != nil {
		t.Fatal(err)
	}
	var version bool
	for _, a := range d.stage("build").Commands {
		if s, ok := a.(interface{ String() string }); ok && strings.HasPrefix(s.String(), "ARG VERSION") {
			version = true
		}
	}
	if _, ok := rls.Build.Args["VERSION"]; !ok || !version {
		t.Errorf("the build should pass VERSION, the Dockerfile's version ARG")
	}
	users := commands[*instructions.UserCommand](d.final())
	if len(users) != 1 || rls.User != users[0].User {
		t.Errorf("envoy-rls runs as %q, the image as %v", rls.User, users)
	}
	if !rls.ReadOnly {
		t.Errorf("envoy-rls should run with a read-only root file system, as on Kubernetes")
	}
	if len(rls.Command) == 0 || rls.Command[0] != "serve" {
		t.Fatalf("envoy-rls command %q: want serve (the image's entrypoint is the binary)", rls.Command)
	}
	checkFlagsExist(t, "docker-compose.yml envoy-rls command", rls.Command[1:])
	defaults := flagDefaults(t)
	grpcPort, httpPort := addrPort(t, defaults["grpc-addr"]), addrPort(t, defaults["http-addr"])
	if got := rls.containerPorts(t); !slices.Equal(got, []int{httpPort, grpcPort}) {
		t.Errorf("envoy-rls publishes %v, it listens on %d and %d", got, httpPort, grpcPort)
	}

	// The config mount: --config is a directory holding only the example
	// descriptor config.
	configDir, ok := flagValue(rls.Command, "config")
	if !ok {
		t.Fatal("no --config")
	}
	var configFiles []string
	for target, src := range rls.mounts(t) {
		if path.Dir(target) != configDir {
			t.Errorf("mount %s is outside --config %s", target, configDir)
		}
		configFiles = append(configFiles, src)
	}
	if !slices.Equal(configFiles, []string{"examples/ratelimit.yaml"}) {
		t.Errorf("envoy-rls mounts %v, want examples/ratelimit.yaml", configFiles)
	}
	checkConfig(t, repoPath("examples/ratelimit.yaml"))

	// Redis: --redis-url names the redis service.
	u, _ := flagValue(rls.Command, "redis-url")
	if b, _ := flagValue(rls.Command, "backend"); b != "redis" || u != "redis://redis:6379/0" {
		t.Errorf("envoy-rls should use the redis service: --backend %q --redis-url %q", b, u)
	}
	if !slices.Contains(rls.DependsOn, "redis") || !strings.HasPrefix(c.Services["redis"].Image, "redis:") {
		t.Errorf("the redis service should run Redis before envoy-rls")
	}

	// Envoy: its bootstrap is examples/envoy.yaml, whose clusters reach the
	// compose services on the ports they listen on.
	envoy := c.Services["envoy"]
	i := slices.Index(envoy.Command, "-c")
	if i < 0 || envoy.mounts(t)[envoy.Command[i+1]] != "examples/envoy.yaml" {
		t.Fatalf("envoy does not run examples/envoy.yaml: %q %v", envoy.Command, envoy.Volumes)
	}
	bs, rl := loadBootstrap(t)
	appPort := -1
	for _, a := range c.Services["app"].Command {
		if v, ok := strings.CutPrefix(a, "-listen=:"); ok {
			appPort, _ = strconv.Atoi(v)
		}
	}
	wantClusters := map[string][2]any{
		rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(): {"envoy-rls", grpcPort},
	}
	for _, cl := range bs.GetStaticResources().GetClusters() {
		eps := cl.GetLoadAssignment().GetEndpoints()
		if len(eps) != 1 || len(eps[0].LbEndpoints) != 1 {
			t.Errorf("cluster %s: want one endpoint", cl.Name)
			continue
		}
		sa := eps[0].LbEndpoints[0].GetEndpoint().GetAddress().GetSocketAddress()
		want, ok := wantClusters[cl.Name]
		if !ok {
			want = [2]any{"app", appPort}
		}
		if got := [2]any{sa.GetAddress(), int(sa.GetPortValue())}; got != want {
			t.Errorf("cluster %s reaches %v, want %v", cl.Name, got, want)
		}
	}
	var listenPorts []int
	for _, l := range bs.GetStaticResources().GetListeners() {
		listenPorts = append(listenPorts, int(l.GetAddress().GetSocketAddress().GetPortValue()))
	}
	for _, p := range listenPorts {
		if !slices.Contains(envoy.containerPorts(t), p) {
			t.Errorf("envoy listens on %d but does not publish it", p)
		}
	}
}

// TestComposeEnvoyRLSStarts runs the binary with the compose command (the
// config and Redis pointed at test equivalents, listeners on free loopback
// ports).
func TestComposeEnvoyRLSStarts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	rls := loadCompose(t).Services["envoy-rls"]
	var dir string
	for target, src := range rls.mounts(t) {
		dir = configMapDir(t, map[string]string{path.Base(target): string(readRepoFile(t, src))})
	}
	args := setFlag(rls.Command, "config", dir)
	args = setFlag(args, "redis-url", "redis://"+startRedis(t)+"/0")
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args = append(args, fmt.Sprintf("--grpc-addr=127.0.0.1:%d", freePort(t)), "--http-addr="+httpAddr)
	p := start(t, exec.Command(envoyRLS(t), args...))
	p.waitHTTP(t, "http://"+httpAddr+"/healthz")
	_, rl := loadBootstrap(t)
	if !limitFor(t, httpAddr, rl.Domain, []entry{{"remote_address", "192.0.2.1"}}) {
		t.Errorf("no limit for the client address descriptor")
	}
	p.stop(t)
}
