package health

import (
	"context"
	"fmt"
)

// Attempts is what QStash's delivery attempts were over a window. QStash bills every
// attempt, so retries are cost: Attempts / Delivered is what a delivered event costs.
type Attempts struct {
	// Delivered messages were processed by a consumer in the window; DeliveryAttempts is
	// the attempts QStash made for them (Upstash-Retried + 1). UnknownAttempts of them were
	// recorded without a retry count (before migration 0011, or by a consumer that does not
	// pass it) and count as one attempt each. Deliveries absorbed as duplicates are not
	// recorded, so the totals are a lower bound.
	Delivered        int64 `json:"delivered"`
	DeliveryAttempts int64 `json:"delivery_attempts"`
	UnknownAttempts  int64 `json:"unknown_attempts"`
	// DeadLettered deliveries were given up by QStash in the window (delivery dead letters,
	// from the failure callback or dlq sync), after DeadLetterAttempts attempts.
	DeadLettered       int64 `json:"dead_lettered"`
	DeadLetterAttempts int64 `json:"dead_letter_attempts"`
	// Total is every attempt: DeliveryAttempts + DeadLetterAttempts.
	Total int64 `json:"attempts"`
	// PerDelivered is Total / Delivered; 0 when nothing was delivered.
	PerDelivered float64 `json:"attempts_per_delivered"`
}

// AttemptsReport is Attempts over the last hour and the last day.
type AttemptsReport struct {
	LastHour Attempts `json:"last_hour"`
	LastDay  Attempts `json:"last_day"`
}

// CollectAttempts reads QStash's delivery attempts over the last hour and day from
// processed_messages.retried and the delivery dead letters, in one statement.
func CollectAttempts(ctx context.Context, db DB) (AttemptsReport, error) {
	var r AttemptsReport
	h, d := &r.LastHour, &r.LastDay
	err := db.QueryRow(ctx, qAttempts).Scan(&h.Delivered, &h.DeliveryAttempts, &h.UnknownAttempts, &h.DeadLettered, &h.DeadLetterAttempts,
		&d.Delivered, &d.DeliveryAttempts, &d.UnknownAttempts, &d.DeadLettered, &d.DeadLetterAttempts)
	if err != nil {
		return AttemptsReport{}, fmt.Errorf("query delivery attempts: %w", err)
	}
	for _, a := range []*Attempts{h, d} {
		a.Total = a.DeliveryAttempts + a.DeadLetterAttempts
		if a.Delivered > 0 {
			a.PerDelivered = float64(a.Total) / float64(a.Delivered)
		}
	}
	return r, nil
}
