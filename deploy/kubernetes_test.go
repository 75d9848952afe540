package deploy_test

import (
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	monv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const k8sDir = "deploy/kubernetes"

// k8s is the decoded deploy/kubernetes.
type k8s struct {
	kust       *kustomization
	objs       []object
	deployment *appsv1.Deployment // envoy-rls
	redis      *appsv1.Deployment
	service    *corev1.Service // envoy-rls
	redisSvc   *corev1.Service
	configMap  *corev1.ConfigMap
}

func loadK8s(t *testing.T) *k8s {
	t.Helper()
	k := &k8s{kust: only[*kustomization](t, loadManifests(t, k8sDir+"/kustomization.yaml"))}
	for _, r := range k.kust.Resources {
		k.objs = append(k.objs, loadManifests(t, k8sDir+"/"+r)...)
	}
	for _, d := range all[*appsv1.Deployment](k.objs) {
		switch d.Name {
		case "envoy-rls":
			k.deployment = d
		case "envoy-rls-redis":
			k.redis = d
		}
	}
	for _, s := range all[*corev1.Service](k.objs) {
		switch s.Name {
		case "envoy-rls":
			k.service = s
		case "envoy-rls-redis":
			k.redisSvc = s
		}
	}
	k.configMap = only[*corev1.ConfigMap](t, k.objs)
	if k.deployment == nil || k.redis == nil || k.service == nil || k.redisSvc == nil {
		t.Fatalf("deploy/kubernetes needs Deployments and Services envoy-rls and envoy-rls-redis")
	}
	return k
}

func (k *k8s) container(t *testing.T) corev1.Container {
	t.Helper()
	cs := k.deployment.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("want one container in the envoy-rls Deployment, got %d", len(cs))
	}
	return cs[0]
}

// deploymentConfigDir is where the Deployment mounts the ConfigMap.
func deploymentConfigDir(t *testing.T) string {
	t.Helper()
	k := loadK8s(t)
	c := k.container(t)
	dir, ok := flagValue(c.Args, "config")
	if !ok {
		t.Fatalf("the Deployment's args have no --config: %q", c.Args)
	}
	return dir
}

// configMapConfig is the descriptor config of the ConfigMap.
func configMapConfig(t *testing.T) string {
	t.Helper()
	k := loadK8s(t)
	if len(k.configMap.Data) != 1 {
		t.Fatalf("want one file in the ConfigMap, got %d", len(k.configMap.Data))
	}
	for _, v := range k.configMap.Data {
		return v
	}
	return ""
}

// k8sNamespace is the namespace the kustomization puts everything in.
func (k *k8s) namespace() string { return k.kust.Namespace }

// serviceHost is the cluster DNS name of a Service of deploy/kubernetes.
func (k *k8s) serviceHost(s *corev1.Service) string {
	return s.Name + "." + k.namespace() + ".svc.cluster.local"
}

func servicePort(t *testing.T, s *corev1.Service, name string) corev1.ServicePort {
	t.Helper()
	for _, p := range s.Spec.Ports {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("Service %s has no port %q", s.Name, name)
	return corev1.ServicePort{}
}

// containerPort resolves a probe's or Service's target port in a container.
func containerPort(t *testing.T, c corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort
		}
	}
	t.Fatalf("container %s has no port %s", c.Name, p.String())
	return 0
}

func TestKustomization(t *testing.T) {
	k := loadK8s(t)
	// Every manifest in the directory is a resource, except the optional
	// ServiceMonitor, which the kustomization names in a comment.
	entries, err := os.ReadDir(repoPath(k8sDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		n := e.Name()
		if n == "kustomization.yaml" || !strings.HasSuffix(n, ".yaml") {
			continue
		}
		if !slices.Contains(k.kust.Resources, n) && n != "servicemonitor.yaml" {
			t.Errorf("%s/%s is not in kustomization.yaml's resources", k8sDir, n)
		}
	}
	if !strings.Contains(string(readRepoFile(t, k8sDir+"/kustomization.yaml")), "# - servicemonitor.yaml") {
		t.Errorf("kustomization.yaml does not say how to add servicemonitor.yaml")
	}
	ns := only[*corev1.Namespace](t, k.objs)
	if k.namespace() == "" || ns.Name != k.namespace() {
		t.Errorf("kustomization namespace %q, Namespace object %q", k.namespace(), ns.Name)
	}
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("the namespace does not enforce the restricted Pod Security Standard")
	}
	// The kustomize image entry rewrites exactly the Deployment's image.
	c := k.container(t)
	if len(k.kust.Images) != 1 {
		t.Fatalf("want one kustomize image entry")
	}
	img := k.kust.Images[0]
	if c.Image != img.Name+":"+img.NewTag {
		t.Errorf("Deployment image %q, kustomization sets %s:%s", c.Image, img.Name, img.NewTag)
	}
}

func TestDeployment(t *testing.T) {
	k := loadK8s(t)
	d := k.deployment
	pod := d.Spec.Template.Spec
	c := k.container(t)

	sel, err := metav1LabelSelector(d.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the Deployment's selector does not match its pods")
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("want at least 2 replicas (they share Redis)")
	}

	// Non-root, read-only, no token, no injected ENVOY_RLS_* variables.
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("automountServiceAccountToken must be false")
	}
	if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
		t.Errorf("enableServiceLinks must be false: the Service envoy-rls would inject ENVOY_RLS_SERVICE_HOST and friends")
	}
	psc, sc := pod.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65534 ||
		psc.RunAsGroup == nil || *psc.RunAsGroup != 65534 {
		t.Errorf("the pod must run as non-root uid/gid 65534: %+v", psc)
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("the pod needs the RuntimeDefault seccomp profile")
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("the container needs a read-only root, no privilege escalation and no capabilities: %+v", sc)
	}

	// Resources: requests and limits for CPU and memory, requests <= limits.
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, okR := c.Resources.Requests[r]
		lim, okL := c.Resources.Limits[r]
		if !okR || !okL {
			t.Errorf("%s: want a request and a limit", r)
			continue
		}
		if req.Cmp(lim) > 0 {
			t.Errorf("%s: request %s above limit %s", r, req.String(), lim.String())
		}
	}

	// The config: the ConfigMap, mounted whole (no subPath, so reload sees
	// the kubelet's symlink swap) where --config points.
	dir := deploymentConfigDir(t)
	var volume string
	for _, m := range c.VolumeMounts {
		if m.MountPath == dir {
			volume = m.Name
			if m.SubPath != "" || m.SubPathExpr != "" {
				t.Errorf("the config is mounted with a subPath: ConfigMap updates would never arrive")
			}
			if !m.ReadOnly {
				t.Errorf("the config mount is not read-only")
			}
		}
	}
	var fromCM string
	for _, v := range pod.Volumes {
		if v.Name == volume && v.ConfigMap != nil {
			fromCM = v.ConfigMap.Name
		}
	}
	if fromCM != k.configMap.Name {
		t.Errorf("--config %s is not the ConfigMap %s mounted as a volume", dir, k.configMap.Name)
	}

	// Ports are the binary's defaults (the flags don't move them).
	defaults := flagDefaults(t)
	checkFlagsExist(t, "Deployment args", c.Args[1:])
	if c.Args[0] != "serve" {
		t.Errorf("args %q: want serve", c.Args)
	}
	for _, f := range []string{"grpc-addr", "http-addr"} {
		if _, ok := flagValue(c.Args, f); ok {
			t.Errorf("the Deployment sets --%s; keep the defaults the ports below assume", f)
		}
	}
	want := map[string]int32{
		"grpc": int32(addrPort(t, defaults["grpc-addr"])),
		"http": int32(addrPort(t, defaults["http-addr"])),
	}
	for name, port := range want {
		if got := containerPort(t, c, intstr.FromString(name)); got != port {
			t.Errorf("container port %s is %d, envoy-rls listens on %d", name, got, port)
		}
	}

	// Probes: HTTP GETs on the HTTP port (answered in TestDeploymentStarts).
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe: want an HTTP GET", name)
			continue
		}
		if containerPort(t, c, p.HTTPGet.Port) != want["http"] {
			t.Errorf("%s probe is not on the HTTP port", name)
		}
	}

	// Shutdown fits in the grace period: preStop sleep, then the drain.
	grace := 5 * time.Second
	if v, ok := flagValue(c.Args, "shutdown-grace"); ok {
		if grace, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	} else if v := defaults["shutdown-grace"]; v != "" {
		if grace, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	var preStop time.Duration
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	if pod.TerminationGracePeriodSeconds == nil ||
		time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second <= preStop+grace {
		t.Errorf("terminationGracePeriodSeconds must exceed preStop (%v) + --shutdown-grace (%v)", preStop, grace)
	}

	// Redis: --redis-url names the example Redis Service.
	u, ok := flagValue(c.Args, "redis-url")
	if !ok {
		t.Fatalf("no --redis-url")
	}
	if want := fmt.Sprintf("redis://%s:%d/0", k.redisSvc.Name, servicePort(t, k.redisSvc, "redis").Port); u != want {
		t.Errorf("--redis-url %s, the Redis Service is %s", u, want)
	}
	rc := k.redis.Spec.Template.Spec.Containers[0]
	if containerPort(t, rc, servicePort(t, k.redisSvc, "redis").TargetPort) != 6379 {
		t.Errorf("the Redis Service does not reach redis-server's port")
	}
	for _, img := range []string{c.Image, rc.Image} {
		if tag := imageTag(img); tag == "" || tag == "latest" {
			t.Errorf("image %s: pin a version tag", img)
		}
	}
}

func imageTag(img string) string {
	_, tag, _ := strings.Cut(path.Base(img), ":")
	return tag
}

func TestServicePDBAndServiceMonitor(t *testing.T) {
	k := loadK8s(t)
	c := k.container(t)
	podLabels := labels.Set(k.deployment.Spec.Template.Labels)
	if !labels.SelectorFromSet(k.service.Spec.Selector).Matches(podLabels) {
		t.Errorf("the Service does not select the pods")
	}
	grpc := servicePort(t, k.service, "grpc")
	if grpc.AppProtocol == nil || *grpc.AppProtocol != "grpc" {
		t.Errorf("the gRPC port needs appProtocol: grpc (HTTP/2 for meshes and gateways)")
	}
	if containerPort(t, c, grpc.TargetPort) != int32(addrPort(t, flagDefaults(t)["grpc-addr"])) {
		t.Errorf("the Service's grpc port does not reach the gRPC listener")
	}
	for _, name := range []string{"http", "metrics"} {
		p := servicePort(t, k.service, name)
		if containerPort(t, c, p.TargetPort) != int32(addrPort(t, flagDefaults(t)["http-addr"])) {
			t.Errorf("the Service's %s port does not reach the HTTP listener", name)
		}
	}

	pdb := only[*policyv1.PodDisruptionBudget](t, k.objs)
	sel, err := metav1LabelSelector(pdb.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(podLabels) {
		t.Errorf("the PodDisruptionBudget does not select the pods")
	}
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() < 1 ||
		pdb.Spec.MinAvailable.IntValue() >= int(*k.deployment.Spec.Replicas) {
		t.Errorf("minAvailable must keep one pod and allow a drain")
	}

	sm := only[*monv1.ServiceMonitor](t, loadManifests(t, k8sDir+"/servicemonitor.yaml"))
	smSel, err := metav1LabelSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !smSel.Matches(labels.Set(k.service.Labels)) {
		t.Errorf("the ServiceMonitor does not select the Service")
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("the ServiceMonitor must scrape port metrics at /metrics: %+v", sm.Spec.Endpoints)
	}
}
