package telemetry_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/telemetry"
)

func TestEnabled(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
	} {
		if got := telemetry.Enabled(func(k string) string { return c.env[k] }); got != c.want {
			t.Errorf("Enabled(%v) = %v, want %v", c.env, got, c.want)
		}
	}
}

// TestSetupExportsOverOTLP: with an OTLP endpoint set, Setup exports through the real
// exporter, and Flush delivers a finished span before it returns (what a Lambda needs).
func TestSetupExportsOverOTLP(t *testing.T) {
	var posts atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" && r.Header.Get("Content-Type") == "application/x-protobuf" {
			posts.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL, "OTEL_SERVICE_NAME": "relay-test"}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL) // the SDK reads the process environment
	ctx := context.Background()
	p, err := telemetry.Setup(ctx, func(k string) string { return env[k] }, "outbox-relay")
	if err != nil || p == nil {
		t.Fatalf("Setup = %v, %v", p, err)
	}
	defer p.Shutdown(ctx)
	_, s := p.Tracer().Start(ctx, "one")
	s.End()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if posts.Load() == 0 {
		t.Fatal("Flush returned before the span reached the collector")
	}

	off, err := telemetry.Setup(ctx, func(string) string { return "" }, "x")
	if off != nil || err != nil || off.Tracer() != nil || off.Flush(ctx) != nil {
		t.Fatalf("Setup without OTEL_* = %v, %v; want tracing off, nil-safe", off, err)
	}
}
