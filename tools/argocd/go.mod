// Pins the Argo CD the GitOps tests run (one binary for every component); tools/argocd/build.sh builds it.
//
// v3.2.11 is the newest release that builds here from the Go module proxy: v3.6 needs Go 1.27 and a
// nested module its zip lacks, v3.4 and v3.5 depend on a module the proxy refuses, and the zips served
// for v3.3.19 and v3.2.12 do not compile. Argo CD's own go.mod replaces modules, and replaces in a
// dependency are ignored, so it is built inside its own module tree (build.sh), not as a `tool` here:
// this file only pins the version, and go.sum its checksums.
module neuronfleet.local/tools/argocd

go 1.26.6

require github.com/argoproj/argo-cd/v3 v3.2.11
