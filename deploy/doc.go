// Package deploy checks the deployment files: the Dockerfile (parsed, and
// its build command run), docker-compose.yml, the Kubernetes manifests in
// deploy/kubernetes, and the Envoy Gateway, Envoy AI Gateway, Istio and
// kgateway examples.
//
// It is a module of its own so that the Kubernetes, Envoy Gateway, Istio and
// BuildKit modules its tests decode with stay out of envoy-rls's go.mod. It
// tests envoy-rls as a black box: the binary the Dockerfile builds, started
// as a process. `make test` runs it.
package deploy
