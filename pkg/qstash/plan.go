package qstash

import "fmt"

// Plan is a QStash pricing plan. Its limits are enforced by QStash; the publisher checks
// the ones it can before sending (message size, queue count), and the local server
// (qstashtest, --plan) rejects what production would. Sources: docs/qstash-contract.md.
type Plan string

const (
	// PlanFree is the free plan: the smallest message size and fewest queues.
	PlanFree Plan = "free"
	// PlanPayg is pay-as-you-go.
	PlanPayg Plan = "payg"
	// PlanFixed is the fixed-price plan.
	PlanFixed Plan = "fixed"
	// DefaultPlan is assumed when none is set: pay-as-you-go, also the official dev
	// server's default (`qstash dev -quota payg`).
	DefaultPlan = PlanPayg
)

// PlanLimits are the plan-dependent limits this project relies on.
type PlanLimits struct {
	// MaxMessageBytes is the largest message body, in bytes. QStash writes "1 MB"; the
	// unit is not documented, so the stricter decimal megabyte is used.
	MaxMessageBytes int64
	// MaxQueues is the number of queues an account may have ("Queue Count").
	MaxQueues int
	// MaxRetries is the largest Upstash-Retries ("Max Retry Count"; only on the older
	// pricing page, see the contract document).
	MaxRetries int
	// MaxParallelism is the account's delivery parallelism: deliveries in flight at once.
	MaxParallelism int
}

var planLimits = map[Plan]PlanLimits{
	// upstash.com/pricing/qstash.md (stored 2026-05): free 1 MB, queue count 10,
	// parallelism 10; docs.upstash.com/qstash/pricing (older): max retry count 3.
	PlanFree: {MaxMessageBytes: 1_000_000, MaxQueues: 10, MaxRetries: 3, MaxParallelism: 10},
	// Same page: pay as you go 10 MB, queue count 100, parallelism 100; older page:
	// max retry count 5.
	PlanPayg: {MaxMessageBytes: 10_000_000, MaxQueues: 100, MaxRetries: 5, MaxParallelism: 100},
	// Same page: fixed plans 50 MB, parallelism 200 (Fixed 1M) and 1000 (Fixed 10M),
	// queue count 1000; older page: Pro max retry count 20. The smaller parallelism is
	// used, so the local server models the smaller fixed plan.
	PlanFixed: {MaxMessageBytes: 50_000_000, MaxQueues: 1000, MaxRetries: 20, MaxParallelism: 200},
}

// Limits returns the plan's limits; an unknown plan is an error naming the valid ones.
func (p Plan) Limits() (PlanLimits, error) {
	l, ok := planLimits[p]
	if !ok {
		return PlanLimits{}, fmt.Errorf("unknown QStash plan %q: want %q, %q or %q", p, PlanFree, PlanPayg, PlanFixed)
	}
	return l, nil
}

// MaxRequestBytes is QStash's limit on one publish or batch request body: 100 MB since
// the December 2024 changelog. Larger requests are answered 413.
const MaxRequestBytes = 100_000_000
