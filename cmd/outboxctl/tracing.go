package main

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/telemetry"
)

// Service names (OTEL_SERVICE_NAME unless the environment sets one): outboxctl's own, and
// outboxctl relay's, which runs what the relay Lambda runs.
const (
	tracingServiceName      = "outboxctl"
	tracingRelayServiceName = "outbox-relay"
)

// startTracing sets tracing up from the OTEL_* variables in getenv (package telemetry):
// the tracer is nil, and stop does nothing, when they name no exporter. stop flushes what
// was recorded, waiting at most a few seconds for the collector.
func startTracing(ctx context.Context, getenv func(string) string, service string) (tr trace.Tracer, stop func(), err error) {
	tel, err := telemetry.Setup(ctx, getenv, service)
	if err != nil {
		return nil, nil, usageErr(fmt.Errorf("set up tracing: %w", err))
	}
	return tel.Tracer(), func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tel.Shutdown(sctx)
	}, nil
}
