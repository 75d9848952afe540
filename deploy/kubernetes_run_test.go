package deploy_test

import (
	"fmt"
	"maps"
	"net/http"
	"os/exec"
	"testing"
	"time"

	monv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestDeploymentStarts runs the binary with the Deployment's exact args and
// environment (the Redis URL pointed at a test redis-server, the config at a
// directory laid out as the kubelet mounts the ConfigMap, listeners on free
// loopback ports) and checks the probes and the metrics path answer.
func TestDeploymentStarts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	k := loadK8s(t)
	c := k.container(t)
	dir := configMapDir(t, k.configMap.Data)
	checkConfig(t, dir)

	args := setFlag(c.Args, "config", dir)
	args = setFlag(args, "redis-url", "redis://"+startRedis(t)+"/0")
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args = append(args, fmt.Sprintf("--grpc-addr=127.0.0.1:%d", freePort(t)), "--http-addr="+httpAddr)
	cmd := exec.Command(envoyRLS(t), args...)
	cmd.Env = []string{"HOME=/nonexistent"}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.ResourceFieldRef == nil || e.ValueFrom.ResourceFieldRef.Resource != "limits.memory" {
				t.Fatalf("env %s: the test resolves only limits.memory", e.Name)
			}
			lim := c.Resources.Limits[corev1.ResourceMemory]
			v = fmt.Sprint(lim.Value()) // what the kubelet puts there (divisor 1)
		}
		cmd.Env = append(cmd.Env, e.Name+"="+v)
	}
	p := start(t, cmd)
	for _, probe := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		p.waitHTTP(t, "http://"+httpAddr+probe.HTTPGet.Path)
	}
	sm := only[*monv1.ServiceMonitor](t, loadManifests(t, k8sDir+"/servicemonitor.yaml"))
	resp, err := http.Get("http://" + httpAddr + sm.Spec.Endpoints[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %d", sm.Spec.Endpoints[0].Path, resp.StatusCode)
	}
	if !limitFor(t, httpAddr, "ratelimit", []entry{{"remote_address", "10.0.0.1"}}) {
		t.Errorf("the ConfigMap's config did not apply")
	}

	// `kubectl apply` of a changed ConfigMap: the kubelet swaps `..data`.
	// The new domain must come into force without a restart.
	data := maps.Clone(k.configMap.Data)
	data["reload-check.yaml"] = "domain: reload-check\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n"
	if limitFor(t, httpAddr, "reload-check", []entry{{"k", "v"}}) {
		t.Fatal("domain reload-check has a limit before the update")
	}
	updateConfigMapDir(t, dir, data)
	deadline := time.Now().Add(time.Minute)
	for !limitFor(t, httpAddr, "reload-check", []entry{{"k", "v"}}) {
		if time.Now().After(deadline) {
			t.Fatalf("the ConfigMap update was not loaded within a minute; output:\n%s", p.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.stop(t)
}

// TestDeploymentLiveWithoutRedis starts the binary with the Deployment's
// args and its Redis unreachable: the liveness probe must still pass, so
// Kubernetes does not restart pods for their backend's sake.
func TestDeploymentLiveWithoutRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	k := loadK8s(t)
	c := k.container(t)
	args := setFlag(c.Args, "config", configMapDir(t, k.configMap.Data))
	args = setFlag(args, "redis-url", fmt.Sprintf("redis://127.0.0.1:%d/0", freePort(t))) // nothing listens
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args = append(args, fmt.Sprintf("--grpc-addr=127.0.0.1:%d", freePort(t)), "--http-addr="+httpAddr)
	p := start(t, exec.Command(envoyRLS(t), args...))
	p.waitHTTP(t, "http://"+httpAddr+c.LivenessProbe.HTTPGet.Path)
	p.stop(t)
}
