package retention

import (
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

func TestQStashRetryHorizon(t *testing.T) {
	t.Parallel()
	// QStash's documented table: 12s, 2m28s, 30m8s, 6h7m6s, then 24h; plus one
	// maxDeliveryAttempt per attempt.
	backoff := map[int]time.Duration{
		0: 0,
		1: 12 * time.Second,
		3: (12 + 148 + 1808) * time.Second,
		5: (12+148+1808+22026)*time.Second + 24*time.Hour,
	}
	for retries, b := range backoff {
		w := b + time.Duration(retries+1)*maxDeliveryAttempt
		got := qstashRetryHorizon(retries)
		if d := got - w; d < -2*time.Second || d > 2*time.Second {
			t.Errorf("QStashRetryHorizon(%d) = %v, want about %v", retries, got, w)
		}
	}
}

func TestRelayRetryHorizon(t *testing.T) {
	t.Parallel()
	// Defaults: ceilings 60,120,240,480,960,1920 s then 1h for attempts 7..11; 12 leases of 30s.
	want := (60+120+240+480+960+1920)*time.Second + 5*time.Hour + 12*30*time.Second
	if got := relayRetryHorizon(relay.Config{}); got != want {
		t.Fatalf("RelayRetryHorizon = %v, want %v", got, want)
	}
}

func TestValidateDedupeTTL(t *testing.T) {
	t.Parallel()
	if err := ValidateDedupeTTL(DefaultDedupeTTL, relay.Config{}, 3); err != nil {
		t.Fatalf("the default TTL must pass with the default config: %v", err)
	}
	if h := Horizon(relay.Config{}, 3); h > 8*time.Hour || h < 7*time.Hour {
		t.Fatalf("default horizon %v moved; update DefaultDedupeTTL's doc", h)
	}
	if err := ValidateDedupeTTL(DefaultDedupeTTL, relay.Config{}, 17); err != nil {
		t.Fatalf("the doc says 14 days passes with 17 QStash retries: %v", err)
	}
	if err := ValidateDedupeTTL(DefaultDedupeTTL, relay.Config{}, 18); err == nil {
		t.Fatal("the doc says 18 QStash retries need a longer TTL")
	}

	h := Horizon(relay.Config{}, 3)
	for _, ttl := range []time.Duration{time.Hour, h, h - time.Second} {
		err := ValidateDedupeTTL(ttl, relay.Config{}, 3)
		if err == nil {
			t.Fatalf("TTL %v (horizon %v) accepted", ttl, h)
		}
		msg := err.Error()
		if !strings.Contains(msg, ttl.String()) || !strings.Contains(msg, h.Round(time.Second).String()) {
			t.Fatalf("error must print both the TTL %v and the horizon %v: %s", ttl, h.Round(time.Second), msg)
		}
	}
	if err := ValidateDedupeTTL(h+time.Second, relay.Config{}, 3); err != nil {
		t.Fatalf("TTL just above the horizon refused: %v", err)
	}
	// A longer relay budget moves the horizon.
	long := relay.Config{MaxAttempts: 30, BackoffMax: 6 * time.Hour}
	if err := ValidateDedupeTTL(3*24*time.Hour, long, 3); err == nil || !strings.Contains(err.Error(), "72h0m0s") {
		t.Fatalf("3 days against a 30-attempt, 6h-backoff relay: %v", err)
	}
	if err := ValidateDedupeTTL(DefaultDedupeTTL, relay.Config{}, -1); err == nil {
		t.Fatal("negative retries accepted")
	}
}

// TestValidateOutboxRetention: a retention inside the retry horizon is refused with both
// numbers; the default passes; longer retry budgets move the bound.
func TestValidateOutboxRetention(t *testing.T) {
	t.Parallel()
	if err := ValidateOutboxRetention(DefaultOutboxRetention, relay.Config{}, 3); err != nil {
		t.Fatalf("the default retention must pass with the default config: %v", err)
	}
	h := Horizon(relay.Config{}, 3)
	for _, r := range []time.Duration{time.Hour, h} {
		err := ValidateOutboxRetention(r, relay.Config{}, 3)
		if err == nil || !strings.Contains(err.Error(), "OutboxRetention: "+r.String()) || !strings.Contains(err.Error(), h.Round(time.Second).String()) {
			t.Fatalf("retention %v (horizon %v): %v; want refused naming both", r, h, err)
		}
	}
	if err := ValidateOutboxRetention(h+time.Second, relay.Config{}, 3); err != nil {
		t.Fatalf("retention just above the horizon refused: %v", err)
	}
	if err := ValidateOutboxRetention(DefaultOutboxRetention, relay.Config{}, 30); err == nil {
		t.Fatal("7 days against QStash's 30-retry horizon (about 25 days) accepted")
	}
	if err := ValidateOutboxRetention(DefaultOutboxRetention, relay.Config{}, -1); err == nil {
		t.Fatal("negative retries accepted")
	}
}
