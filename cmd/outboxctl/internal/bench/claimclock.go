package bench

import (
	"context"
	"sync"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// claimClock times the relay's claims from the "claim" span the relay records for every
// batch (relay.Config.Tracer): the statement as the relay waited for it, rows decoded. A
// claim that found nothing records no span, so it is not counted. The pinned scenario
// reports these per window: what the claim costs while the horizon is pinned, beside the
// end-to-end latency that the rest of the machine also moves.
type claimClock struct {
	mu     sync.Mutex
	claims []claimTime
}

type claimTime struct {
	at   time.Time // the claim's start, this process's clock
	took time.Duration
}

// tracer returns a tracer whose "claim" spans c records.
func (c *claimClock) tracer() trace.Tracer {
	return sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(c)).Tracer("outboxctl/bench")
}

// OnEnd records a finished "claim" span (sdktrace.SpanProcessor).
func (c *claimClock) OnEnd(s sdktrace.ReadOnlySpan) {
	if s.Name() != "claim" {
		return
	}
	c.mu.Lock()
	c.claims = append(c.claims, claimTime{at: s.StartTime(), took: s.EndTime().Sub(s.StartTime())})
	c.mu.Unlock()
}

func (c *claimClock) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c *claimClock) Shutdown(context.Context) error                  { return nil }
func (c *claimClock) ForceFlush(context.Context) error                { return nil }

// snapshot returns the claims recorded so far.
func (c *claimClock) snapshot() []claimTime {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]claimTime(nil), c.claims...)
}
