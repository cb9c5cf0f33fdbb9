package localstack_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outbox-relay/outbox-relay/v3/internal/localstack"
	"github.com/outbox-relay/outbox-relay/v3/internal/telemetry"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

var updateDocs = flag.Bool("update-docs", false, "run the local stack with tracing and rewrite docs/trace.svg from its first event trace")

// levels are the four spans of one event's trace, as the README's picture must show them.
var levels = []string{"place order", "send ", "process order.created", "inbox commit"}

// TestWriteTraceSVG: the SVG is well-formed XML with one bar per span of the first event
// trace (the producer's span, the batch span that links it, the delivery and its commit),
// the linked bar dashed, and no unrelated span; without an event trace it is ErrNoTrace.
func TestWriteTraceSVG(t *testing.T) {
	t.Parallel()
	spans := sampleSpans(t)
	var b bytes.Buffer
	if err := localstack.WriteTraceSVG(&b, spans); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	if err := wellFormed(svg); err != nil {
		t.Fatalf("not well-formed XML: %v\n%s", err, svg)
	}
	if n := strings.Count(svg, "<rect x="); n != 4 {
		t.Fatalf("%d bars, want 4:\n%s", n, svg)
	}
	for _, want := range append(levels, `stroke-dasharray`) {
		if !strings.Contains(svg, want) {
			t.Fatalf("SVG lacks %q:\n%s", want, svg)
		}
	}
	if strings.Contains(svg, "unrelated") {
		t.Fatal("SVG draws a span outside the event's trace")
	}
	if err := localstack.WriteTraceSVG(io.Discard, nil); !errors.Is(err, localstack.ErrNoTrace) {
		t.Fatalf("no spans: %v, want ErrNoTrace", err)
	}
}

// TestDocsTraceSVG keeps docs/trace.svg, the README's picture, a picture of the four
// levels. With -update-docs it first regenerates it from a real run of the local stack
// (Postgres, the built-in QStash, relay, webhook) with an in-memory span recorder.
func TestDocsTraceSVG(t *testing.T) { // not parallel with -update-docs: the tracer provider is global
	path := filepath.Join("..", "..", "docs", "trace.svg")
	if *updateDocs {
		rec := tracetest.NewSpanRecorder()
		tel, err := telemetry.NewProvider(context.Background(), rec, "outboxctl-dev")
		if err != nil {
			t.Fatal(err)
		}
		defer tel.Shutdown(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		s, err := localstack.Run(ctx, localstack.Options{DatabaseURL: pgtest.URL(), Tracer: tel.Tracer(),
			Producer: localstack.ProducerConfig{Events: 5, Keys: 5}})
		if err != nil || !s.OK() || s.Processed != 5 {
			t.Fatalf("local stack: %+v, %v", s, err)
		}
		var b bytes.Buffer
		if err := localstack.WriteTraceSVG(&b, rec.Ended()); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (regenerate with go test ./internal/localstack -run TestDocsTraceSVG -update-docs)", err)
	}
	svg := string(raw)
	if err := wellFormed(svg); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	at := 0
	for _, l := range levels {
		j := strings.Index(svg[at:], l)
		if j < 0 {
			t.Fatalf("%s lacks %q after the levels before it (regenerate with -update-docs)", path, l)
		}
		at += j + len(l)
	}
}

func wellFormed(s string) error {
	d := xml.NewDecoder(strings.NewReader(s))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
