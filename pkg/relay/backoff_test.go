package relay

import (
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck/configchecktest"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	base, maxD := 30*time.Second, time.Hour
	cases := []struct {
		attempt int
		r       float64
		want    time.Duration
	}{
		{1, 0, MinBackoff},                         // floor
		{1, 0.999999, 59999940 * time.Microsecond}, // ceiling 60s
		{1, 0.5, 30 * time.Second},
		{3, 0.5, 120 * time.Second},  // ceiling 240s
		{7, 0.5, 30 * time.Minute},   // 3840s capped at 3600s
		{100, 0.5, 30 * time.Minute}, // no overflow
		{1000, 0.25, 15 * time.Minute},
	}
	for _, tc := range cases {
		if got := backoff(tc.attempt, base, maxD, tc.r); got != tc.want {
			t.Errorf("Backoff(%d, r=%v) = %v, want %v", tc.attempt, tc.r, got, tc.want)
		}
	}
}

func TestBackoffIsJittered(t *testing.T) {
	t.Parallel()
	seen := map[time.Duration]bool{}
	for _, r := range []float64{0.1, 0.2, 0.3, 0.4} {
		seen[backoff(4, 30*time.Second, time.Hour, r)] = true
	}
	if len(seen) != 4 {
		t.Fatalf("delays not spread: %v", seen)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := (Config{}).WithDefaults().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	bad := Config{BatchSize: -1, Lease: time.Second, PublishTimeout: 2 * time.Second, MaxAttempts: -3, BackoffBase: time.Millisecond}.WithDefaults()
	configchecktest.RequireFields(t, bad.Validate(), "relay", "BatchSize", "Lease", "MaxAttempts", "BackoffBase")
	if _, err := New(nil, nil, Config{}); err == nil {
		t.Fatal("New without db and publisher succeeded")
	}
}

func TestRetryHorizon(t *testing.T) {
	t.Parallel()
	// 11 retries: 60+120+240+480+960+1920 s, then 5 x 3600 s.
	want := (60+120+240+480+960+1920)*time.Second + 5*time.Hour
	if got := (Config{}).RetryHorizon(); got != want {
		t.Fatalf("RetryHorizon = %v, want %v", got, want)
	}
}
