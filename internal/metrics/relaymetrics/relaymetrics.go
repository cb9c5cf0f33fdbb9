// Package relaymetrics turns a drain's relay.Stats into the project's metrics. It sits
// apart from package metrics so the receiver functions, which link metrics, do not link
// the relay engine, and apart from pkg/relay so the library's API names no internal type.
package relaymetrics

import (
	"github.com/outbox-relay/outbox-relay/v3/internal/metrics"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// Values returns st's figures as metrics (EMF lines, Prometheus): its Counts under their
// metric names, and PublishLatency.
func Values(st relay.Stats) []metrics.Value {
	return metrics.Relay(st.Counts(), st.PublishLatency)
}
