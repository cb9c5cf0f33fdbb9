package bench

import (
	"context"
	"sync"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// claimClock times the steps of the relay's batches from the spans the relay records for
// each (relay.Config.Tracer): "claim" (the statement as the relay waited for it, rows
// decoded), "publish" (one call to the local QStash) and "mark". A claim that found nothing
// records no span, so it is not counted. The pinned scenario reports these per window:
// what the claim costs while the horizon is pinned, and which step of the relay's round
// the end-to-end latency waits on, beside what the rest of the machine also moves.
type claimClock struct {
	mu     sync.Mutex
	claims []claimTime
}

type claimTime struct {
	step string    // claimStep, publishStep or markStep
	at   time.Time // the step's start, this process's clock
	took time.Duration
}

// The relay's span names that claimClock records.
const (
	claimStep   = "claim"
	publishStep = "publish"
	markStep    = "mark"
)

// tracer returns a tracer whose claim, publish and mark spans c records.
func (c *claimClock) tracer() trace.Tracer {
	return sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(c)).Tracer("outboxctl/bench")
}

// OnEnd records a finished claim, publish or mark span (sdktrace.SpanProcessor).
func (c *claimClock) OnEnd(s sdktrace.ReadOnlySpan) {
	switch s.Name() {
	case claimStep, publishStep, markStep:
	default:
		return
	}
	c.mu.Lock()
	c.claims = append(c.claims, claimTime{step: s.Name(), at: s.StartTime(), took: s.EndTime().Sub(s.StartTime())})
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
