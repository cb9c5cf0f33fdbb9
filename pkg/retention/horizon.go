package retention

import (
	"fmt"
	"math"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// maxDeliveryAttempt bounds how long one QStash delivery attempt can be in flight: the
// webhook is a Lambda, and no invocation outlives Lambda's 15-minute maximum. A delivery
// whose response QStash did not see (the handler committed, then timed out) is retried.
const maxDeliveryAttempt = 15 * time.Minute

// qstashBackoffCap is QStash's longest delay between retries: min(86400, e^(2.5n)) s.
const qstashBackoffCap = 24 * time.Hour

// qstashRetryHorizon is the longest QStash can keep delivering one message: the sum of its
// default backoff min(86400, e^(2.5n)) s for n = 1..retries, plus one maxDeliveryAttempt
// per attempt (1 + retries).
func qstashRetryHorizon(retries int) time.Duration {
	var total time.Duration
	for n := 1; n <= retries; n++ {
		s := math.Min(qstashBackoffCap.Seconds(), math.Exp(2.5*float64(n)))
		total += time.Duration(s * float64(time.Second))
	}
	return total + time.Duration(retries+1)*maxDeliveryAttempt
}

// relayRetryHorizon is the longest the relay can keep re-publishing one event: every
// backoff ceiling up to MaxAttempts (relay.Config.RetryHorizon), plus a full lease per
// attempt, because an attempt may hold its lease until it expires before its backoff
// even starts (a relay that died mid-publish).
func relayRetryHorizon(cfg relay.Config) time.Duration {
	cfg = cfg.WithDefaults()
	return cfg.RetryHorizon() + time.Duration(cfg.MaxAttempts)*cfg.Lease
}

// Horizon is the longest time between a consumer first processing a message and the last
// possible delivery of the same message id: a publish the relay believed failed (the
// response was lost) is retried as late as relayRetryHorizon, and that publish is
// delivered, at the latest, qstashRetryHorizon later. QStash's 10-minute deduplication
// window is deliberately not added: it removes duplicates inside it, it never delays one.
func Horizon(relayCfg relay.Config, qstashRetries int) time.Duration {
	return relayRetryHorizon(relayCfg) + qstashRetryHorizon(qstashRetries)
}

// ValidateDedupeTTL refuses a dedupe TTL that does not outlive the whole retry horizon: a
// record deleted before the last possible redelivery lets that redelivery run its side
// effects a second time. The error prints both numbers.
func ValidateDedupeTTL(ttl time.Duration, relayCfg relay.Config, qstashRetries int) error {
	return outlivesHorizon("DedupeTTL", ttl, relayCfg, qstashRetries, "a late redelivery would be processed twice")
}

// ValidateOutboxRetention refuses an outbox retention that does not outlive the retry
// horizon: retention deletes a dispatched row OutboxRetention after its dispatch, while the
// relay may still re-publish it (a publish whose answer was lost) and QStash may still be
// retrying its delivery; a failure callback or redrive arriving after that finds no row to
// mark or reset. The error prints both numbers.
func ValidateOutboxRetention(retention time.Duration, relayCfg relay.Config, qstashRetries int) error {
	return outlivesHorizon("OutboxRetention", retention, relayCfg, qstashRetries,
		"a dispatched event could be deleted while QStash still delivers it, and its failure callback or redrive would find nothing")
}

// outlivesHorizon refuses d, the retention's field, unless it outlives the retry horizon;
// the error prints both numbers, the risk and the fix.
func outlivesHorizon(field string, d time.Duration, relayCfg relay.Config, qstashRetries int, risk string) error {
	if qstashRetries < 0 {
		return fmt.Errorf("QStash retries %d must not be negative", qstashRetries)
	}
	h := Horizon(relayCfg, qstashRetries)
	if d <= h {
		return &publish.ConfigError{Config: "retention", Field: field, Reason: fmt.Sprintf("%v (%.0fs) is shorter than the retry horizon %v (%.0fs: relay %v + QStash %d retries %v); "+
			"%s: raise it above %v or shorten the retry budgets",
			d, d.Seconds(), h.Round(time.Second), h.Seconds(), relayRetryHorizon(relayCfg).Round(time.Second),
			qstashRetries, qstashRetryHorizon(qstashRetries).Round(time.Second), risk, h.Round(time.Hour)+time.Hour)}
	}
	return nil
}
