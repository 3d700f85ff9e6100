package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
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

// stepTokens is the scorer's full prefill step in the tests, in the producer's tokens: it counts a request of
// N bytes as N/4 prompt tokens and 1.5 times as many for its output, so a 16,000-byte prompt is 10,000.
const stepTokens = 5000

func scorer(t *testing.T, name string) *InFlightTokensScorer {
	t.Helper()
	plugin, err := InFlightTokensScorerFactory(name, json.RawMessage(fmt.Sprintf(`{"stepTokens": %d}`, stepTokens)), nil)
	if err != nil {
		t.Fatal(err)
	}
	return plugin.(*InFlightTokensScorer)
}

// scores runs GIE's producer over the endpoints, as the director does before it schedules, then the scorer.
func scores(t *testing.T, producer requestcontrol.PrepareDataPlugin, endpoints ...framework.Endpoint) []float64 {
	t.Helper()
	request := &framework.LLMRequest{RequestSizeBytes: 100}
	if err := producer.PrepareRequestData(context.Background(), request, endpoints); err != nil {
		t.Fatal(err)
	}
	byEndpoint := scorer(t, InFlightTokensScorerType).Score(context.Background(), nil, request, endpoints)
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
		if math.Abs(got[i]-want[i]) > 1e-9 {
			return false
		}
	}
	return true
}

func send(producer *inflightload.InFlightLoadProducer, id string, bytes int, to framework.Endpoint) *framework.LLMRequest {
	request := &framework.LLMRequest{RequestId: id, RequestSizeBytes: bytes}
	producer.PreRequest(context.Background(), request, routedTo(to))
	return request
}

func newProducer(t *testing.T) *inflightload.InFlightLoadProducer {
	t.Helper()
	plugin, err := inflightload.InFlightLoadProducerFactory("producer", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return plugin.(*inflightload.InFlightLoadProducer)
}

// A long prompt routed to one replica makes the next request prefer the others at once, whatever the
// engines' metrics say; answered, it weighs nothing any more.
func TestALongPromptInFlightSendsTheNextRequestElsewhere(t *testing.T) {
	producer := newProducer(t)
	busy, idle, short := replica("busy"), replica("idle"), replica("short")

	if got := scores(t, producer, busy, idle, short); !equal(got, []float64{1, 1, 1}) {
		t.Fatalf("nothing in flight: scores %v, want all 1", got)
	}
	long := send(producer, "long", 16000, busy)
	send(producer, "short", 4000, short)
	// 10,000 and 2,500 tokens: the spread is larger than a step.
	if got := scores(t, producer, busy, idle, short); !equal(got, []float64{0, 1, 0.75}) {
		t.Fatalf("a long and a short prompt in flight: scores %v, want [0 1 0.75]", got)
	}

	answered := &requestcontrol.Response{RequestId: "long", EndOfStream: true}
	producer.ResponseBody(context.Background(), long, answered, busy.GetMetadata())
	// 2,500 tokens is half a step: the short one's replica is not scored as if it were full.
	if got := scores(t, producer, busy, idle, short); !equal(got, []float64{1, 1, 0.5}) {
		t.Fatalf("the long one answered: scores %v, want [1 1 0.5]", got)
	}
}

// Replicas that all hold more than a step are scored by what each holds beyond the least loaded.
func TestReplicasAllBusyAreStillToldApart(t *testing.T) {
	producer := newProducer(t)
	less, more := replica("less"), replica("more")
	send(producer, "a", 16000, less)
	send(producer, "b", 16000, more)
	send(producer, "c", 4000, more)
	if got := scores(t, producer, less, more); !equal(got, []float64{1, 0.5}) {
		t.Fatalf("10,000 and 12,500 tokens in flight: scores %v, want [1 0.5]", got)
	}
}

func TestWithoutTheProducerEveryEndpointScoresTheSame(t *testing.T) {
	mine := scorer(t, "mine")
	first, second := replica("a"), replica("b")
	got := mine.Score(context.Background(), nil, &framework.LLMRequest{}, []framework.Endpoint{first, second})
	if got[first] != 1 || got[second] != 1 {
		t.Fatalf("scores %v, want both 1", got)
	}
	if name := mine.TypedName(); name.Type != InFlightTokensScorerType || name.Name != "mine" {
		t.Fatalf("typed name %v", name)
	}
}

func TestAStepOfNoTokensIsRefused(t *testing.T) {
	for _, parameters := range []string{``, `{}`, `{"stepTokens": 0}`, `{"stepTokens": "many"}`} {
		if _, err := InFlightTokensScorerFactory("mine", json.RawMessage(parameters), nil); err == nil {
			t.Fatalf("parameters %q: no error", parameters)
		}
	}
}
