package main

import (
	"context"
	"encoding/json"
	"fmt"

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
//
// Scores fall from 1 (the least loaded endpoint) by what an endpoint holds beyond it, over the candidates'
// spread or over one full prefill step (stepTokens), whichever is larger. Over the spread alone, one short
// request in flight would weigh as much as a full step and outweigh a replica's cached prefix; over a step,
// a few short requests barely count, a long prompt counts in full, and endpoints that all hold more than a
// step are still told apart.
type InFlightTokensScorer struct {
	typedName  fwkplugin.TypedName
	stepTokens int64
}

// InFlightTokensParameters are the scorer's parameters in an EndpointPickerConfig.
type InFlightTokensParameters struct {
	// StepTokens is the most prompt tokens one prefill step of the engines takes (their max_num_batched_tokens).
	StepTokens int64 `json:"stepTokens"`
}

var _ framework.Scorer = &InFlightTokensScorer{}

// InFlightTokensScorerFactory makes the scorer from its parameters; stepTokens must be positive.
func InFlightTokensScorerFactory(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	parameters := InFlightTokensParameters{}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &parameters); err != nil {
			return nil, fmt.Errorf("%s %q: parameters: %w", InFlightTokensScorerType, name, err)
		}
	}
	if parameters.StepTokens <= 0 {
		return nil, fmt.Errorf("%s %q: stepTokens must be a positive number of tokens, got %d",
			InFlightTokensScorerType, name, parameters.StepTokens)
	}
	return &InFlightTokensScorer{
		typedName:  fwkplugin.TypedName{Type: InFlightTokensScorerType, Name: name},
		stepTokens: parameters.StepTokens,
	}, nil
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

// Score gives each endpoint 1 - (its tokens - the least) / max(the most - the least, stepTokens).
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
	spread := max(most-least, s.stepTokens)
	scores := make(map[framework.Endpoint]float64, len(endpoints))
	for _, endpoint := range endpoints {
		scores[endpoint] = 1 - float64(tokens[endpoint]-least)/float64(spread)
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
