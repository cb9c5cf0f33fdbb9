package relay

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/internal/tracing"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// defaultTraceDestination names the batch span's destination when the publisher does not
// say where it sends (see destinationNamer).
const defaultTraceDestination = "qstash"

// destinationNamer is implemented by a publisher that can say where every message goes
// (the qstash publisher: its destination base URL). The batch span is named after it.
type destinationNamer interface {
	DestinationBase() string
}

// Span attributes of the mark span (the counts it writes), and the publish span's deferred
// count; the batch span has the batch's Stats.Counts (statsAttributes).
const (
	attrDispatched   = attribute.Key("outbox.relay.dispatched")
	attrRetried      = attribute.Key("outbox.relay.retried")
	attrDeadLettered = attribute.Key("outbox.relay.dead_lettered")
	attrReleased     = attribute.Key("outbox.relay.released")
	attrDeferred     = attribute.Key("outbox.relay.deferred")
)

// statsAttributes are a batch's counts as batch span attributes: outbox.relay.<name> for
// each of Stats.Counts, and outbox.relay.deferred, the messages deferred for any reason.
func statsAttributes(st Stats) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, len(st.counters())+1)
	for name, n := range st.Counts() {
		attrs = append(attrs, attribute.Int("outbox.relay."+name, n))
	}
	return append(attrs, attrDeferred.Int(st.DeferredQuota+st.DeferredDeployment+st.DeferredOutage))
}

// traceDestination is what the batch spans of pub are named after.
func traceDestination(pub Publisher) string {
	if d, ok := pub.(destinationNamer); ok && d.DestinationBase() != "" {
		return d.DestinationBase()
	}
	return defaultTraceDestination
}

// processTraced is process inside the batch span: a span that starts when the claim did,
// linked to the producer span of every claimed event, with the claim as its first child;
// publish and mark add theirs. Only called with a Tracer.
func (r *Relay) processTraced(ctx context.Context, lease outboxstore.Lease, c outboxstore.Claimed, claimedAt time.Time) (Stats, error) {
	claimed := time.Now()
	headers := make([]map[string]string, len(c.Messages))
	for i, m := range c.Messages {
		headers[i] = m.Headers
	}
	ctx, span := tracing.StartBatch(ctx, r.cfg.Tracer, r.destination, headers, trace.WithTimestamp(claimedAt))
	defer span.End()
	_, cs := r.cfg.Tracer.Start(ctx, "claim", trace.WithTimestamp(claimedAt), trace.WithAttributes(
		attribute.Int("outbox.relay.claimed", c.Len()), attribute.Int("outbox.relay.undecodable", len(c.Undecodable))))
	cs.End(trace.WithTimestamp(claimed))

	st, err := r.processBatch(ctx, lease, c, claimedAt)
	span.SetAttributes(statsAttributes(st)...)
	if err != nil {
		// The error text names rows and statements, never payloads; still, the class is
		// what a trace backend needs: the logs have the rest.
		span.SetStatus(codes.Error, "record batch outcome failed")
	}
	return st, err
}

// recordTraced is record inside a "mark" child span of the batch span.
func (r *Relay) recordTraced(ctx context.Context, lease outboxstore.Lease, out marks, st *Stats) error {
	ctx, span := r.cfg.Tracer.Start(ctx, "mark", trace.WithAttributes(
		attrDispatched.Int(len(out.published)), attrRetried.Int(len(out.retries)),
		attrDeadLettered.Int(len(out.dead)), attrReleased.Int(len(out.released))))
	defer span.End()
	err := r.record(ctx, lease, out, st)
	if err != nil {
		span.SetStatus(codes.Error, "record batch outcome failed")
	}
	return err
}

// publishTraced is one Publisher.Publish call inside a "publish" child span of the batch
// span, with the outcome of its messages counted.
func (r *Relay) publishTraced(ctx context.Context, batch []outbox.Message) []publish.Result {
	ctx, span := r.cfg.Tracer.Start(ctx, "publish", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.Int("messaging.batch.message_count", len(batch))))
	defer span.End()
	results := r.pub.Publish(ctx, batch)
	var published, retryable, permanent, deferred int
	for _, res := range results {
		switch res.Outcome() {
		case publish.Published:
			published++
		case publish.Retryable:
			retryable++
		case publish.PermanentFailure:
			permanent++
		case publish.Deferred:
			deferred++
		}
	}
	span.SetAttributes(attribute.Int("outbox.relay.published", published), attribute.Int("outbox.relay.retryable", retryable),
		attribute.Int("outbox.relay.permanent", permanent), attrDeferred.Int(deferred))
	if published == 0 && len(batch) > 0 {
		span.SetStatus(codes.Error, "no message accepted")
	}
	return results
}
