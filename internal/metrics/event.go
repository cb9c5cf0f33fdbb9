package metrics

import (
	"fmt"
	"iter"
	"math"
	"slices"
	"time"
)

// Event is one observation: the metrics a function emitted for one unit of work (a drain,
// a delivery, a retention run).
type Event struct {
	// Function is the Function dimension (FunctionRelay, FunctionWebhook, FunctionFailure).
	Function string
	// Topic adds the [Function, Topic] dimension set when it is one of the sink's bounded
	// topics; otherwise it is recorded as a plain field (EMF) or dropped (Prometheus).
	Topic string
	// Time is the observation time; zero means the sink's clock.
	Time time.Time
	// Values are the metrics, each a name from Definitions.
	Values []Value
	// Properties are extra top-level fields of the EMF line (searchable in Logs Insights,
	// not metrics), e.g. request_id. Prometheus ignores them.
	Properties map[string]string
}

// Value is one metric's observations in an Event: one number for counters and gauges,
// any number of samples for distributions.
type Value struct {
	Name   string
	Values []float64
}

// Count returns a one-number Value.
func Count(name string, n int64) Value { return Value{Name: name, Values: []float64{float64(n)}} }

// Relay returns a drain's counts (relay.Stats.Counts: snake_case names in a fixed order)
// as the relay counters of the same CamelCase name ("dead_lettered" is DeadLettered), in
// that order, and PublishLatency in milliseconds when latency has samples. A count without
// a counter of its name is left out: publish_calls, which PublishLatency's samples count.
func Relay(counts iter.Seq2[string, int], latency []time.Duration) []Value {
	var vs []Value
	for name, n := range counts {
		if d, ok := relayCounter(name); ok {
			vs = append(vs, Count(d.Name, int64(n)))
		}
	}
	if len(latency) > 0 {
		ms := make([]float64, len(latency))
		for i, d := range latency {
			ms[i] = float64(d.Microseconds()) / 1000
		}
		vs = append(vs, Value{Name: PublishLatency, Values: ms})
	}
	return vs
}

// relayCounter is the relay counter whose name is name in snake_case.
func relayCounter(name string) (Definition, bool) {
	for _, d := range Definitions {
		if d.Function == FunctionRelay && d.Kind == Counter && snake(d.Name) == name {
			return d, true
		}
	}
	return Definition{}, false
}

// Backlog returns the backlog gauges: pending rows, how late the latest-to-go due event is
// (OldestPendingAgeSeconds, the template's alarm), the oldest pending row's age from its
// creation (OldestCreatedAgeSeconds), in seconds, and the open consumer circuits.
func Backlog(pending int64, lateness, oldestCreated time.Duration, openCircuits int64) []Value {
	return []Value{
		Count(BacklogPending, pending),
		{Name: OldestPendingAgeSeconds, Values: []float64{lateness.Seconds()}},
		{Name: OldestCreatedAgeSeconds, Values: []float64{oldestCreated.Seconds()}},
		Count(OpenCircuits, openCircuits),
	}
}

// Retention returns the retention counters.
func Retention(outboxDeleted, processedDeleted int64) []Value {
	return []Value{Count(RetentionDeletedOutbox, outboxDeleted), Count(RetentionDeletedProcessed, processedDeleted)}
}

// validate checks names, kinds and numbers; it returns the definitions in Value order.
func (ev Event) validate() ([]Definition, error) {
	if ev.Function == "" {
		return nil, fmt.Errorf("metrics event: Function is empty")
	}
	defs := make([]Definition, len(ev.Values))
	seen := make(map[string]bool, len(ev.Values))
	for i, v := range ev.Values {
		d, ok := Lookup(v.Name)
		if !ok {
			return nil, fmt.Errorf("metrics event: unknown metric %q (add it to Definitions)", v.Name)
		}
		if seen[v.Name] {
			return nil, fmt.Errorf("metrics event: metric %q appears twice", v.Name)
		}
		seen[v.Name] = true
		if d.Kind != Distribution && len(v.Values) > 1 {
			return nil, fmt.Errorf("metrics event: %s is not a distribution but has %d values", v.Name, len(v.Values))
		}
		for _, x := range v.Values {
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return nil, fmt.Errorf("metrics event: %s has a non-finite value", v.Name)
			}
		}
		defs[i] = d
	}
	for k := range ev.Properties {
		if k == "_aws" || k == DimFunction || k == DimTopic || seen[k] {
			return nil, fmt.Errorf("metrics event: property %q collides with a reserved or metric member", k)
		}
	}
	return defs, nil
}

// topicSet is a bounded set of topics allowed as a dimension.
type topicSet []string

func (s topicSet) has(t string) bool { return t != "" && slices.Contains(s, t) }
