package metrics

// DefaultNamespace is the CloudWatch namespace of every metric unless configured otherwise.
const DefaultNamespace = "OutboxRelay"

// Function dimension values: which Lambda (or local process) emitted the metric.
const (
	FunctionRelay   = "relay"
	FunctionWebhook = "webhook"
	FunctionFailure = "failure"
)

// Dimension names.
const (
	DimFunction = "Function"
	DimTopic    = "Topic"
)

// Metric names. They are fixed: the SAM template's alarms and dashboard refer to them.
// Counts are per invocation (or per drain, outside Lambda); ages are in seconds and
// latencies in milliseconds.
const (
	// Claimed counts outbox rows the relay claimed (Function=relay).
	Claimed = "Claimed"
	// Dispatched counts rows QStash accepted and the relay marked dispatched.
	Dispatched = "Dispatched"
	// Retried counts rows that failed transiently and were scheduled again with backoff.
	Retried = "Retried"
	// DeadLettered counts rows the relay moved to dead_letters (permanent failure or
	// retry budget spent).
	DeadLettered = "DeadLettered"
	// Released counts rows claimed but not sent (held behind a failed same-key event,
	// deferred, or left when the deadline came), put back without an attempt.
	Released = "Released"
	// LeaseLost counts rows whose outcome was discarded because another relay had taken
	// them over after the lease expired.
	LeaseLost = "LeaseLost"
	// DeferredQuota counts rows (included in Released) put back because QStash's quota or rate limit was used up.
	DeferredQuota = "DeferredQuota"
	// DeferredDeployment counts rows put back because a setting (URL, token, queue) is
	// wrong; an operator must act.
	DeferredDeployment = "DeferredDeployment"
	// DeferredOutage counts rows put back because QStash was unreachable or failing.
	DeferredOutage = "DeferredOutage"
	// Batches counts claims that leased at least one row.
	Batches = "Batches"
	// PublishLatency is each publish call's duration (one batch to QStash), in milliseconds.
	PublishLatency = "PublishLatency"
	// BacklogPending is the number of rows not yet dispatched or dead-lettered.
	BacklogPending = "BacklogPending"
	// OldestPendingAgeSeconds is how late the latest-to-go due event is, in seconds: the
	// template's latency alarm.
	OldestPendingAgeSeconds = "OldestPendingAgeSeconds"
	// OldestCreatedAgeSeconds is the oldest pending row's age since its creation, in
	// seconds (it includes a delay the producer asked for).
	OldestCreatedAgeSeconds = "OldestCreatedAgeSeconds"
	// OpenCircuits is the number of open consumer circuits (topics whose consumer is down,
	// held in the outbox): the template's open-circuit alarm.
	OpenCircuits = "OpenCircuits"
	// RetentionDeletedOutbox counts dispatched outbox rows the retention task deleted.
	RetentionDeletedOutbox = "RetentionDeletedOutbox"
	// RetentionDeletedProcessed counts processed_messages rows the retention task deleted.
	RetentionDeletedProcessed = "RetentionDeletedProcessed"
	// DLQSyncRecorded counts dead letters copied from QStash's DLQ into dead_letters.
	DLQSyncRecorded = "DLQSyncRecorded"

	// Processed counts deliveries a consumer handled and committed (Function=webhook).
	Processed = "Processed"
	// Duplicate counts deliveries already processed: acknowledged without running the
	// handler again.
	Duplicate = "Duplicate"
	// PermanentFailure counts deliveries a handler marked permanent (QStash stops
	// retrying; the failure callback records them).
	PermanentFailure = "PermanentFailure"
	// TransientFailure counts deliveries that failed and will be retried by QStash.
	TransientFailure = "TransientFailure"
	// Unauthorized counts deliveries whose signature did not verify.
	Unauthorized = "Unauthorized"
	// RejectedDeliveries counts deliveries refused before any handler ran.
	RejectedDeliveries = "RejectedDeliveries"

	// DeliveryDeadLetters counts failure callbacks recorded as dead letters
	// (Function=failure).
	DeliveryDeadLetters = "DeliveryDeadLetters"
	// DeliveriesRescheduled counts failure callbacks of transient failures (the consumer
	// down) put back in the outbox instead of dead-lettered (Function=failure).
	DeliveriesRescheduled = "DeliveriesRescheduled"
	// RejectedCallbacks counts failure callbacks refused: their failures are only in
	// QStash's DLQ.
	RejectedCallbacks = "RejectedCallbacks"
)

// Unit is a CloudWatch metric unit.
type Unit string

// Units used by this project's metrics.
const (
	UnitCount        Unit = "Count"
	UnitMilliseconds Unit = "Milliseconds"
	UnitSeconds      Unit = "Seconds"
)

// Kind says how a metric aggregates, which decides its Prometheus type.
type Kind int

const (
	// Counter values are increments (Prometheus counter, name suffixed _total).
	Counter Kind = iota
	// Gauge values are the current level (Prometheus gauge).
	Gauge
	// Distribution values are samples (Prometheus histogram in base units).
	Distribution
)

// Definition describes one metric: its CloudWatch name and unit, how it aggregates, and
// its help text (also the Prometheus HELP line).
type Definition struct {
	Name string
	Unit Unit
	Kind Kind
	// Function is the Function dimension value of the emitter.
	Function string
	Help     string
}

// Definitions lists every metric this project emits, in a stable order.
var Definitions = []Definition{
	{Claimed, UnitCount, Counter, FunctionRelay, "Outbox rows claimed under a lease."},
	{Dispatched, UnitCount, Counter, FunctionRelay, "Outbox rows published and marked dispatched."},
	{Retried, UnitCount, Counter, FunctionRelay, "Outbox rows rescheduled after a retryable publish failure."},
	{DeadLettered, UnitCount, Counter, FunctionRelay, "Outbox rows dead-lettered by the relay (permanent failure or retry budget exhausted)."},
	{Released, UnitCount, Counter, FunctionRelay, "Claimed rows put back unsent (held behind a failed same-key event, or out of time)."},
	{LeaseLost, UnitCount, Counter, FunctionRelay, "Row outcomes discarded because the lease had expired and another relay took the rows."},
	{DeferredQuota, UnitCount, Counter, FunctionRelay, "Messages the queue refused for a used-up quota or rate limit; put back with no attempt spent."},
	{DeferredDeployment, UnitCount, Counter, FunctionRelay, "Messages the queue refused for a deployment fault (wrong QSTASH_URL or token, a setting every message carries); put back with no attempt spent."},
	{DeferredOutage, UnitCount, Counter, FunctionRelay, "Messages not published because QStash failed or was out of reach for the whole request (5xx, timeout, connection error); put back with no attempt spent."},
	{Batches, UnitCount, Counter, FunctionRelay, "Claim/publish/mark batches run."},
	{PublishLatency, UnitMilliseconds, Distribution, FunctionRelay, "Duration of one Publisher.Publish call."},
	{BacklogPending, UnitCount, Gauge, FunctionRelay, "Outbox rows neither dispatched nor dead-lettered."},
	{OldestPendingAgeSeconds, UnitSeconds, Gauge, FunctionRelay, "How long the longest-waiting due outbox event has been ready and unpublished (a delayed event counts from its AvailableAt); alert on this, not on depth."},
	{OldestCreatedAgeSeconds, UnitSeconds, Gauge, FunctionRelay, "Age of the oldest pending outbox row from its creation, delays included."},
	{OpenCircuits, UnitCount, Gauge, FunctionRelay, "Open consumer circuits: topics whose consumer is down, their events held in the outbox while the relay probes."},
	{RetentionDeletedOutbox, UnitCount, Counter, FunctionRelay, "Finished outbox rows deleted by retention."},
	{RetentionDeletedProcessed, UnitCount, Counter, FunctionRelay, "processed_messages rows deleted by retention."},
	{DLQSyncRecorded, UnitCount, Counter, FunctionRelay, "QStash DLQ entries recorded as dead letters by the dlq-sync task (no failure callback reached dead_letters)."},
	{Processed, UnitCount, Counter, FunctionWebhook, "Deliveries handled for the first time (side effects committed)."},
	{Duplicate, UnitCount, Counter, FunctionWebhook, "Deliveries absorbed as duplicates of an already processed message."},
	{PermanentFailure, UnitCount, Counter, FunctionWebhook, "Deliveries rejected as permanent failures (QStash will not retry them)."},
	{TransientFailure, UnitCount, Counter, FunctionWebhook, "Deliveries that failed transiently (QStash retries them)."},
	{Unauthorized, UnitCount, Counter, FunctionWebhook, "Deliveries refused for a missing or invalid signature."},
	{RejectedDeliveries, UnitCount, Counter, FunctionWebhook, "Deliveries refused before any handler ran: bad signature, identity headers contradicting the signed URL, body over the limit."},
	{DeliveryDeadLetters, UnitCount, Counter, FunctionFailure, "QStash failure callbacks recorded as dead letters."},
	{DeliveriesRescheduled, UnitCount, Counter, FunctionFailure, "QStash failure callbacks of transient failures (the consumer down) put back in the outbox, their topic's circuit opened; never dead-lettered."},
	{RejectedCallbacks, UnitCount, Counter, FunctionFailure, "Failure callbacks refused (bad signature, malformed, over the limit); their failures are only in QStash's DLQ."},
}

// Lookup returns the definition of name.
func Lookup(name string) (Definition, bool) {
	for _, d := range Definitions {
		if d.Name == name {
			return d, true
		}
	}
	return Definition{}, false
}
