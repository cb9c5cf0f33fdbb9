package localstack

import "testing"

func TestPoisonCountIsExactAndSpread(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		events int
		pct    float64
		want   int
	}{{2000, 2, 40}, {1000, 1, 10}, {99, 2, 1}, {10, 0, 0}, {7, 100, 7}, {1000, 0.5, 5}} {
		cfg := ProducerConfig{Events: tc.events, PoisonPercent: tc.pct, Keys: 50}
		if got := cfg.PoisonCount(); got != tc.want {
			t.Fatalf("%+v: PoisonCount = %d, want %d", tc, got, tc.want)
		}
		n, keys := 0, map[int]bool{}
		set := cfg.poisonSet()
		for i := 0; i < tc.events; i++ {
			if set[i] {
				n++
				keys[i%cfg.Keys] = true
			}
		}
		if n != tc.want {
			t.Fatalf("%+v: %d poison events, want %d", tc, n, tc.want)
		}
		if tc.want > 1 && len(keys) < 2 {
			t.Fatalf("%+v: poison not spread across keys", tc)
		}
	}
}
