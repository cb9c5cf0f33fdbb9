package relay_test

import (
	"context"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// BenchmarkDrain measures claim+mark throughput of one relay with a no-op publisher, over
// 1,000 keys: the database-bound part of the relay (outboxctl bench adds HTTP). Tracing is
// off (Tracer nil): its numbers must stay within noise of those before tracing existed.
func BenchmarkDrain(b *testing.B) {
	for _, batch := range []int{100, 500} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) { benchDrain(b, batch, nil) })
	}
}

// BenchmarkDrainTraced is BenchmarkDrain (batch=100) with a Tracer whose provider records
// every span and exports none: the cost of the instrumentation itself.
func BenchmarkDrainTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider()
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	benchDrain(b, 100, tp.Tracer("bench"))
}

func benchDrain(b *testing.B, batch int, tr trace.Tracer) {
	db := pgtest.New(b)
	const n = 20000
	pub := &fakePublisher{}
	r, err := relay.New(db.Pool, pub, relay.Config{BatchSize: batch, Tracer: tr})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		seed(b, db, n, func(i int) string { return fmt.Sprintf("key-%d", i%1000) })
		// Measured with statistics, as autovacuum keeps them in production: on a
		// never-analysed table the planner picks plans about 3x slower.
		if _, err := db.Pool.Exec(context.Background(), "VACUUM ANALYZE outbox"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		st, err := r.Drain(context.Background())
		if err != nil || st.Dispatched != n {
			b.Fatalf("%+v %v", st, err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "events/s")
}
