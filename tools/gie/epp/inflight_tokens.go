package main

import (
	"context"
	"encoding/json"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/attribute/concurrency"
)

// InFlightTokensScorerType is the scorer's type in an EndpointPickerConfig.
const InFlightTokensScorerType = "inflight-tokens-scorer"

// InFlightTokensScorer prefers the endpoints holding the fewest tokens this picker has sent them and not yet
// seen answered, as GIE's inflight-load-producer counts them (it must be in the config too).
//
// A Neuron replica runs one prefill per step, so a short request sent to one that is prefilling a long prompt
// waits out the whole prefill. The engines' metrics show that prefill only once the picker next scrapes them;
// a request routed in between would go by stale figures. The picker's own count changes the moment it routes.
// Scores are spread between the least and the most loaded endpoint (1 and 0), as GIE's queue scorers do, so
// a few thousand tokens tell two replicas apart however large the pool's capacity.
type InFlightTokensScorer struct {
	typedName fwkplugin.TypedName
}

var _ framework.Scorer = &InFlightTokensScorer{}

// InFlightTokensScorerFactory makes the scorer; it takes no parameters.
func InFlightTokensScorerFactory(name string, _ json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	return &InFlightTokensScorer{typedName: fwkplugin.TypedName{Type: InFlightTokensScorerType, Name: name}}, nil
}

// TypedName is the plugin's type and name.
func (s *InFlightTokensScorer) TypedName() fwkplugin.TypedName { return s.typedName }

// Category: the scorer spreads load.
func (s *InFlightTokensScorer) Category() framework.ScorerCategory { return framework.Distribution }

// Consumes declares nothing, though the scorer reads the producer's InFlightLoad: GIE v1.5.0 checks a
// consumer against its producer by comparing the pointers each declares, which never match (its own
// token-load-scorer is refused so). The producer runs before any scorer all the same: the director prepares
// every request's data before it schedules.
func (s *InFlightTokensScorer) Consumes() map[string]any { return nil }

// Score gives each endpoint (max - its tokens) / (max - min) of the candidates' in-flight tokens; all 1 when
// they hold the same.
func (s *InFlightTokensScorer) Score(
	_ context.Context, _ *framework.CycleState, _ *framework.LLMRequest, endpoints []framework.Endpoint,
) map[framework.Endpoint]float64 {
	tokens := make(map[framework.Endpoint]int64, len(endpoints))
	for _, endpoint := range endpoints {
		tokens[endpoint] = inFlightTokens(endpoint)
	}
	least, most := int64(0), int64(0)
	for i, endpoint := range endpoints {
		if i == 0 || tokens[endpoint] < least {
			least = tokens[endpoint]
		}
		if i == 0 || tokens[endpoint] > most {
			most = tokens[endpoint]
		}
	}
	scores := make(map[framework.Endpoint]float64, len(endpoints))
	for _, endpoint := range endpoints {
		if most == least {
			scores[endpoint] = 1
		} else {
			scores[endpoint] = float64(most-tokens[endpoint]) / float64(most-least)
		}
	}
	return scores
}

// inFlightTokens is what the producer put on the endpoint for this request; none counts as 0.
func inFlightTokens(endpoint framework.Endpoint) int64 {
	value, found := endpoint.Get(concurrency.InFlightLoadKey)
	if !found {
		return 0
	}
	if load, ok := value.(*concurrency.InFlightLoad); ok {
		return load.Tokens
	}
	return 0
}
