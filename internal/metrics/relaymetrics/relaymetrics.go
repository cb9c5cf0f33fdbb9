// Package relaymetrics turns a drain's relay.Stats into the project's metrics. It sits
// apart from package metrics so the receiver functions, which link metrics, do not link
// the relay engine, and apart from pkg/relay so the library's API names no internal type.
package relaymetrics

import (
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/pkg/relay"
)

// Values returns st's figures as metrics (EMF lines, Prometheus).
func Values(st relay.Stats) []metrics.Value {
	return metrics.Relay(metrics.RelayCounts{
		Batches: st.Batches, Claimed: st.Claimed, Dispatched: st.Dispatched, Retried: st.Retried,
		DeadLettered: st.DeadLettered, Released: st.Released, LeaseLost: st.LeaseLost,
		DeferredQuota: st.DeferredQuota, DeferredDeployment: st.DeferredDeployment, DeferredOutage: st.DeferredOutage,
		PublishLatency: st.PublishLatency,
	})
}
