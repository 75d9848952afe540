package deploy_test

import (
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// TestKustomizeBuild runs kustomize's own build (the library behind
// `kubectl apply -k`) on deploy/kubernetes: it must succeed, put every
// object in the kustomization's namespace, set the image, and its output
// must decode strictly like the files.
func TestKustomizeBuild(t *testing.T) {
	k := loadK8s(t)
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), repoPath(k8sDir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", k8sDir, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, r := range res.Resources() {
		kinds[r.GetKind()]++
		if r.GetKind() != "Namespace" && r.GetNamespace() != k.namespace() {
			t.Errorf("%s/%s is in namespace %q, want %q", r.GetKind(), r.GetName(), r.GetNamespace(), k.namespace())
		}
		raw, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		kind := r.GetApiVersion() + "/" + r.GetKind()
		obj := newTyped(kind)
		if obj == nil {
			t.Fatalf("no Go type for %s", kind)
		}
		if err := decodeStrict(raw, obj); err != nil {
			t.Errorf("kustomize output %s %s: %v", kind, r.GetName(), err)
		}
	}
	for kind, n := range map[string]int{"Namespace": 1, "ConfigMap": 1, "Deployment": 2, "Service": 2, "PodDisruptionBudget": 1} {
		if kinds[kind] != n {
			t.Errorf("kustomize build has %d %s, want %d", kinds[kind], kind, n)
		}
	}
	img := k.kust.Images[0]
	if !strings.Contains(string(out), "image: "+img.Name+":"+img.NewTag+"\n") {
		t.Errorf("kustomize build does not run %s:%s", img.Name, img.NewTag)
	}
}
