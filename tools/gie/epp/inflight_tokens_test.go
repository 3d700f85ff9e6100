package main

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/requestdataproducer/inflightload"
)

func replica(name string) framework.Endpoint {
	meta := &fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}
	return framework.NewEndpoint(meta, &fwkdl.Metrics{}, nil)
}

func routedTo(endpoint framework.Endpoint) *framework.SchedulingResult {
	return &framework.SchedulingResult{
		PrimaryProfileName: "default",
		ProfileResults:     map[string]*framework.ProfileRunResult{"default": {TargetEndpoints: []framework.Endpoint{endpoint}}},
	}
}

// scores runs GIE's producer over the endpoints, as the director does before it schedules, then the scorer.
func scores(t *testing.T, producer requestcontrol.PrepareDataPlugin, endpoints ...framework.Endpoint) []float64 {
	t.Helper()
	request := &framework.LLMRequest{RequestSizeBytes: 100}
	if err := producer.PrepareRequestData(context.Background(), request, endpoints); err != nil {
		t.Fatal(err)
	}
	scorer, _ := InFlightTokensScorerFactory(InFlightTokensScorerType, nil, nil)
	byEndpoint := scorer.(*InFlightTokensScorer).Score(context.Background(), nil, request, endpoints)
	got := make([]float64, len(endpoints))
	for i, endpoint := range endpoints {
		got[i] = byEndpoint[endpoint]
	}
	return got
}

func equal(got, want []float64) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// A long prompt routed to one replica makes the next request prefer the others at once, whatever the
// engines' metrics say; answered, it weighs nothing any more.
func TestALongPromptInFlightSendsTheNextRequestElsewhere(t *testing.T) {
	plugin, err := inflightload.InFlightLoadProducerFactory("producer", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	producer := plugin.(*inflightload.InFlightLoadProducer)
	busy, idle, short := replica("busy"), replica("idle"), replica("short")

	if got := scores(t, producer, busy, idle, short); !equal(got, []float64{1, 1, 1}) {
		t.Fatalf("nothing in flight: scores %v, want all 1", got)
	}
	long := &framework.LLMRequest{RequestId: "long", RequestSizeBytes: 16000}
	producer.PreRequest(context.Background(), long, routedTo(busy))
	producer.PreRequest(context.Background(), &framework.LLMRequest{RequestId: "short", RequestSizeBytes: 4000}, routedTo(short))
	if got := scores(t, producer, busy, idle, short); !equal(got, []float64{0, 1, 0.75}) {
		t.Fatalf("a long and a short prompt in flight: scores %v, want [0 1 0.75]", got)
	}

	answered := &requestcontrol.Response{RequestId: "long", EndOfStream: true}
	producer.ResponseBody(context.Background(), long, answered, busy.GetMetadata())
	if got := scores(t, producer, busy, idle, short); !equal(got, []float64{1, 1, 0}) {
		t.Fatalf("the long one answered: scores %v, want [1 1 0]", got)
	}
}

func TestWithoutTheProducerEveryEndpointScoresTheSame(t *testing.T) {
	scorer, _ := InFlightTokensScorerFactory("mine", nil, nil)
	first, second := replica("a"), replica("b")
	got := scorer.(*InFlightTokensScorer).Score(context.Background(), nil, &framework.LLMRequest{}, []framework.Endpoint{first, second})
	if got[first] != 1 || got[second] != 1 {
		t.Fatalf("scores %v, want both 1", got)
	}
	if name := scorer.TypedName(); name.Type != InFlightTokensScorerType || name.Name != "mine" {
		t.Fatalf("typed name %v", name)
	}
}
