// Package telemetry sets up OpenTelemetry tracing for the functions and the CLI from the
// standard OTEL_* variables: an OTLP/HTTP exporter (to the ADOT Lambda layer's collector or
// any OTLP collector), the service resource, the sampler the SDK reads from
// OTEL_TRACES_SAMPLER, and the W3C propagator. Without those variables it returns nil and
// tracing stays off. The instrumentation itself is package tracing, which needs only the
// OpenTelemetry API, so a producer that imports package outbox does not link the SDK.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/tracing"
)

// Variables are the OTEL_* variables the SAM template passes to the functions (from its
// Tracing* parameters). Setup and the SDK honour the specification's other variables too
// (OTEL_EXPORTER_OTLP_HEADERS, OTEL_SERVICE_NAME, ...); these are the ones a deployment of
// this project sets, and the template test holds the template to them.
var Variables = []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"}

// Provider is the tracer provider Setup built; nil when tracing is off. Its methods are
// safe on a nil Provider.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// Tracer returns the project's tracer, or nil when tracing is off.
func (p *Provider) Tracer() trace.Tracer {
	if p == nil {
		return nil
	}
	return p.tp.Tracer(tracing.InstrumentationName)
}

// Flush exports every finished span; a Lambda calls it before each invocation returns,
// because the environment may be frozen right after.
func (p *Provider) Flush(ctx context.Context) error {
	return p.do(ctx, (*sdktrace.TracerProvider).ForceFlush, "flush spans")
}

// Shutdown flushes and stops the exporter.
func (p *Provider) Shutdown(ctx context.Context) error {
	return p.do(ctx, (*sdktrace.TracerProvider).Shutdown, "shut down tracing")
}

// do runs op on the SDK's provider, what naming it in the error; with tracing off there is
// nothing to do.
func (p *Provider) do(ctx context.Context, op func(*sdktrace.TracerProvider, context.Context) error, what string) error {
	if p == nil {
		return nil
	}
	if err := op(p.tp, ctx); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// Enabled reports whether the OTEL_* variables ask for traces: OTEL_TRACES_EXPORTER is
// "otlp" (the default when an OTLP endpoint is set), and OTEL_SDK_DISABLED is not true.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch strings.ToLower(getenv("OTEL_TRACES_EXPORTER")) {
	case "otlp":
		return true
	case "":
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	default:
		return false
	}
}

// Setup configures tracing from the standard variables (OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and its argument, read by the SDK itself)
// and installs it as the global provider and the W3C propagator. It returns nil, nil when
// Enabled is false: tracing stays off. serviceName is used when OTEL_SERVICE_NAME is unset.
func Setup(ctx context.Context, getenv func(string) string, serviceName string) (*Provider, error) {
	if !Enabled(getenv) {
		return nil, nil
	}
	if v := strings.ToLower(getenv("OTEL_EXPORTER_OTLP_PROTOCOL")); v != "" && v != "http/protobuf" {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: only http/protobuf is supported (the ADOT layer's collector and every OTLP collector accept it)", v)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("create otlp trace exporter: %w", err)
	}
	return newProvider(ctx, sdktrace.NewBatchSpanProcessor(exp), serviceName)
}

// NewProvider returns a Provider that hands spans to sp (an in-memory recorder in tests,
// a printer in the local stack) and installs it globally like Setup.
func NewProvider(ctx context.Context, sp sdktrace.SpanProcessor, serviceName string) (*Provider, error) {
	return newProvider(ctx, sp, serviceName)
}

func newProvider(ctx context.Context, sp sdktrace.SpanProcessor, serviceName string) (*Provider, error) {
	// WithFromEnv comes after the default service name, so OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES win.
	res, err := resource.New(ctx, resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(serviceName)), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) && !errors.Is(err, resource.ErrSchemaURLConflict) {
		return nil, fmt.Errorf("describe tracing resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return &Provider{tp: tp}, nil
}
