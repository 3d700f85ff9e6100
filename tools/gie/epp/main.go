// The Endpoint Picker the routers run: GIE's own (cmd/epp's runner, every in-tree plugin), plus the scorer
// in inflight_tokens.go. tools/gie/build.sh builds this package inside GIE's module tree.
package main

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"sigs.k8s.io/gateway-api-inference-extension/cmd/epp/runner"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
)

func main() {
	fwkplugin.Register(InFlightTokensScorerType, InFlightTokensScorerFactory)
	if err := runner.NewRunner().Run(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1)
	}
}
