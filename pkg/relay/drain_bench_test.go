package relay_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/pkg/relay"
)

// BenchmarkDrain measures claim+mark throughput of one relay with a no-op publisher, over
// 1,000 keys: the database-bound part of the relay (outboxctl bench adds HTTP).
func BenchmarkDrain(b *testing.B) {
	for _, batch := range []int{100, 500} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			db := pgtest.New(b)
			const n = 20000
			pub := &fakePublisher{}
			r, err := relay.New(db.Pool, pub, relay.Config{BatchSize: batch})
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
		})
	}
}
