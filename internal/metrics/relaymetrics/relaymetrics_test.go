package relaymetrics_test

import (
	"slices"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/metrics"
	"github.com/outbox-relay/outbox-relay/v3/internal/metrics/relaymetrics"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// TestValuesCoverEveryCount: each of a drain's counts is a defined metric with its value,
// but publish_calls (PublishLatency's samples count the calls), so a counter added to
// relay.Stats without a metric definition fails here instead of vanishing from dashboards.
func TestValuesCoverEveryCount(t *testing.T) {
	t.Parallel()
	st := relay.Stats{Claimed: 1, Dispatched: 2, Retried: 3, DeadLettered: 4, Released: 5, LeaseLost: 6,
		DeferredQuota: 7, DeferredDeployment: 8, DeferredOutage: 9, Batches: 10, PublishCalls: 11,
		PublishLatency: []time.Duration{1500 * time.Microsecond}}
	got := map[string]float64{}
	var names []string
	for _, v := range relaymetrics.Values(st) {
		if _, ok := metrics.Lookup(v.Name); !ok {
			t.Fatalf("%s is not a defined metric", v.Name)
		}
		got[v.Name] = v.Values[0]
		names = append(names, v.Name)
	}
	want := []string{metrics.Claimed, metrics.Dispatched, metrics.Retried, metrics.DeadLettered, metrics.Released,
		metrics.LeaseLost, metrics.DeferredQuota, metrics.DeferredDeployment, metrics.DeferredOutage, metrics.Batches, metrics.PublishLatency}
	if !slices.Equal(names, want) {
		t.Fatalf("metrics %v, want %v", names, want)
	}
	n := 0
	for name, c := range st.Counts() {
		if name == "publish_calls" {
			continue
		}
		n++
		if got[names[n-1]] != float64(c) {
			t.Fatalf("%s = %v, want %s's %d", names[n-1], got[names[n-1]], name, c)
		}
	}
	if got[metrics.PublishLatency] != 1.5 {
		t.Fatalf("PublishLatency %v ms, want 1.5", got[metrics.PublishLatency])
	}
}
