package relay

import "github.com/outbox-relay/outbox-relay/pkg/metrics"

// Metrics returns the drain's figures as the project's metrics (EMF lines, Prometheus).
func (s Stats) Metrics() []metrics.Value {
	return metrics.Relay(metrics.RelayCounts{
		Batches: s.Batches, Claimed: s.Claimed, Dispatched: s.Dispatched, Retried: s.Retried,
		DeadLettered: s.DeadLettered, Released: s.Released, LeaseLost: s.LeaseLost,
		DeferredQuota: s.DeferredQuota, DeferredDeployment: s.DeferredDeployment, DeferredOutage: s.DeferredOutage,
		PublishLatency: s.PublishLatency,
	})
}
