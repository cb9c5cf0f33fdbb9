package receivertest

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outbox-relay/outbox-relay/v3/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// StartReceiver checks how r reads its environment (RequireConfig with v), then runs its
// cold start as Start does, with v.Good as its public URL.
func StartReceiver(t *testing.T, r receiverfunc.Receiver, v Vars, path string) (http.Handler, *pgtest.DB, *tracetest.SpanRecorder) {
	t.Helper()
	RequireConfig(t, r.Read, v)
	return Start(t, r.Read, r.Build, map[string]string{v.PublicURL: v.Good}, path)
}

// ServeTraced is ServeSigned, then checks that the tracer the cold start was given (rec's)
// reaches the handler: the request ended the spans named spans, in that order.
func ServeTraced(t *testing.T, h http.Handler, rec *tracetest.SpanRecorder, signedURL, target string, body []byte, spans ...string) {
	t.Helper()
	ServeSigned(t, h, signedURL, target, body)
	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
	}
	if !slices.Equal(names, spans) {
		t.Fatalf("spans %q, want %q", names, spans)
	}
}

// Metrics returns a func that counts one outcome through r's Observer, as the cold start
// wires it, and returns the EMF line it wrote, decoded: nil when it wrote none.
func Metrics(t *testing.T, r receiverfunc.Receiver) func(topic, outcome string) map[string]any {
	var buf bytes.Buffer
	obs := r.Observer(&buf, "", slog.New(slog.DiscardHandler))
	return func(topic, outcome string) map[string]any {
		t.Helper()
		buf.Reset()
		obs(topic, outcome)
		if buf.Len() == 0 {
			return nil
		}
		var doc map[string]any
		if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
			t.Fatalf("%s: not one EMF line: %v: %q", outcome, err, buf.String())
		}
		return doc
	}
}
