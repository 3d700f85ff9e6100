// Pins the Gateway API Inference Extension the routing tests run: its Endpoint Picker (cmd/epp) and the
// InferencePool CRD; tools/gie/build.sh builds it.
//
// v1.5.0 is the last release that ships the full picker (v1.6 keeps only the round-robin lwepp). Like
// Argo CD it is built inside its own module tree, with GOWORK=off because its zip carries a go.work:
// this file only pins the version, and go.sum its checksums.
module neuronfleet.local/tools/gie

go 1.26.6

require sigs.k8s.io/gateway-api-inference-extension v1.5.0
