// Package envdoc is the reference of every environment variable the functions and
// `outboxctl relay` read: its name, default, readers and meaning, in one table (Vars) kept
// beside the readers in package envconfig. Its tests fail when a reader asks for a
// variable the table lacks, or the table lists one no reader asks for, so the reference
// (`outboxctl env`, docs/configuration.md) cannot drift from the code.
package envdoc

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig/relayenv"
	"github.com/outbox-relay/outbox-relay/v3/internal/metrics"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/retention"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// Readers is a set of programs that read a variable.
type Readers uint8

const (
	RelayFunction Readers = 1 << iota
	WebhookFunction
	FailureFunction
	// OutboxctlRelay is `outboxctl relay`, the relay outside Lambda.
	OutboxctlRelay
	// OutboxctlEnqueue is `outboxctl enqueue`, a producer.
	OutboxctlEnqueue

	// Relay is both relays: they read the same variables (package relayenv).
	Relay     = RelayFunction | OutboxctlRelay
	Receivers = WebhookFunction | FailureFunction
	All       = Relay | Receivers
)

// String lists the readers, in the order of the constants; "all" is all four.
func (r Readers) String() string {
	if r == All {
		return "all"
	}
	var names []string
	for _, n := range []struct {
		r    Readers
		name string
	}{{RelayFunction, "RelayFunction"}, {WebhookFunction, "WebhookFunction"}, {FailureFunction, "FailureFunction"}, {OutboxctlRelay, "`outboxctl relay`"},
		{OutboxctlEnqueue, "`outboxctl enqueue`"}} {
		if r&n.r != 0 {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ", ")
}

// Source is the code that reads a variable: what the tests check the table against.
type Source string

const (
	// SourceEnvconfig: envconfig.ReadWebhook, envconfig.ReadFailure, relayenv.Read.
	SourceEnvconfig Source = "internal/envconfig"
	// SourceAWSEnv: awsenv.Resolve's references, resolved into DATABASE_URL and the QStash
	// secrets before the configuration is read.
	SourceAWSEnv Source = "internal/awsenv"
	// SourceTelemetry: telemetry.Setup (and the OpenTelemetry SDK it starts).
	SourceTelemetry Source = "internal/telemetry"
	// SourceRelayMain: the relay Lambda's cold start (functions/relay, package relayfunc).
	SourceRelayMain Source = "internal/relayfunc"
	// SourceOutboxctl: a command of cmd/outboxctl that reads a variable of its own.
	SourceOutboxctl Source = "cmd/outboxctl"
)

// Var is one environment variable.
type Var struct {
	Name    string
	Group   string
	Default string
	ReadBy  Readers
	// Sources are the packages that read it; a variable may be read by more than one.
	Sources []Source
	Doc     string
}

// Groups orders the reference's sections.
var Groups = []string{"Database", "QStash", "Relay", "Retention", "Receivers", "Observability", "Lambda runtime"}

func env(s ...Source) []Source { return s }

var ec = env(SourceEnvconfig)

// resolved is a variable awsenv.Resolve reads for every program before its configuration
// is read: a reference to a secret, or a part of the database URL built from one.
func resolved(name, group, def, doc string) Var {
	return Var{name, group, def, All, env(SourceAWSEnv), doc}
}

// otel is a variable the OpenTelemetry SDK reads for every program (telemetry.Setup).
func otel(name, def, doc string) Var {
	return Var{name, "Observability", def, All, env(SourceTelemetry), doc}
}

// Vars is the reference, in the order it is printed within each group.
var Vars = []Var{
	{"DATABASE_URL", "Database", "required (or `DB_SECRET_ARN` / `DB_HOST`)", All, ec,
		"Postgres connection string, `postgres://user:pass@host:5432/db?sslmode=require`. In AWS it is built from `DB_SECRET_ARN` and the `DB_*` variables below; set one or the other, never both. Never repeated in an error message."},
	resolved("DB_SECRET_ARN", "Database", "unset",
		"Secrets Manager secret holding the database credentials as JSON `{\"username\",\"password\",\"host\",\"port\",\"dbname\"}` (the RDS rotation shape); an RDS-managed secret holds only username and password, and `DB_HOST`, `DB_PORT`, `DB_NAME` supply the rest. Read once per cold start and again when the server refuses the password (a rotation)."),
	resolved("DB_HOST", "Database", "the secret's host", "Database or RDS Proxy endpoint; overrides the secret's host."),
	resolved("DB_PORT", "Database", "the secret's port, else 5432", "Database port; overrides the secret's port."),
	resolved("DB_NAME", "Database", "the secret's dbname, else `postgres`", "Database name; overrides the secret's dbname."),
	resolved("DB_USER", "Database", "unset", "With `DB_IAM_AUTH` and no secret: the database user."),
	resolved("DB_SSLMODE", "Database", "`require`", "libpq `sslmode` of the built connection string."),
	resolved("DB_IAM_AUTH", "Database", "`false`", "`true`: authenticate with an RDS IAM token built for every connection instead of a password."),
	resolved("DB_PROXY", "Database", "`false`", "`true`: the endpoint is RDS Proxy or PgBouncer, so no server-side prepared statements (`default_query_exec_mode=exec`)."),

	{"QSTASH_TOKEN", "QStash", "required", Relay, ec, "QStash API token (Upstash console, QStash). In AWS from `QSTASH_TOKEN_PARAM`."},
	resolved("QSTASH_TOKEN_PARAM", "QStash", "unset",
		"SSM SecureString parameter name that holds `QSTASH_TOKEN`; the relay re-reads it once when QStash answers 401/403 (a rotated token). Set it or `QSTASH_TOKEN`, not both."),
	{"QSTASH_CURRENT_SIGNING_KEY", "QStash", "required", Receivers, ec, "QStash current signing key (console, Signing keys): verifies every delivery and failure callback. In AWS from `QSTASH_CURRENT_SIGNING_KEY_PARAM`."},
	resolved("QSTASH_CURRENT_SIGNING_KEY_PARAM", "QStash", "unset", "SSM SecureString parameter name that holds `QSTASH_CURRENT_SIGNING_KEY`."),
	{"QSTASH_NEXT_SIGNING_KEY", "QStash", "required", Receivers, ec, "QStash next signing key; required because an empty key would accept forged tokens. Both keys are accepted, so a key rotation loses no delivery. In AWS from `QSTASH_NEXT_SIGNING_KEY_PARAM`."},
	resolved("QSTASH_NEXT_SIGNING_KEY_PARAM", "QStash", "unset", "SSM SecureString parameter name that holds `QSTASH_NEXT_SIGNING_KEY`."),
	{"QSTASH_URL", "QStash", "`" + qstash.DefaultBaseURL + "`", Relay, ec,
		"QStash API origin: a regional URL, the official dev server or the built-in one (`outboxctl qstash-dev`). Refused at startup with a path (e.g. `/v2`), a query, or plain `http` to a host that is not loopback."},
	{"QSTASH_PLAN", "QStash", "`" + string(qstash.DefaultPlan) + "`", Relay, ec,
		"`free`, `payg` or `fixed`: bounds `FIFO_QUEUES` (" + planList(func(l qstash.PlanLimits) string { return fmt.Sprint(l.MaxQueues) }) + "), `QSTASH_RETRIES` (" + planList(func(l qstash.PlanLimits) string { return fmt.Sprint(l.MaxRetries) }) + ") and the message size; sources in [the QStash contract](qstash-contract.md)."},
	{"QSTASH_MAX_MESSAGE_BYTES", "QStash", "the plan's (" + planList(func(l qstash.PlanLimits) string { return fmt.Sprint(l.MaxMessageBytes) }) + ")", Relay, ec,
		"Largest payload sent; a larger one is not sent but dead-lettered alone, with an error that says so."},
	{"QSTASH_MAX_REQUEST_BYTES", "QStash", bytes(qstash.DefaultMaxRequestBytes), Relay, ec,
		"Byte budget of one `/v2/batch` request (QStash's limit is 100 MB): a batch is split by size as well as by count."},
	{"QSTASH_RETRIES", "QStash", fmt.Sprint(qstash.DefaultRetries), Relay, ec,
		"QStash's retry budget per message (`Upstash-Retries`); 0 is a single delivery attempt; at most the plan's."},
	{"QSTASH_RETRY_DELAY", "QStash", "unset (QStash's backoff: the last retry about 32.8 min after the first attempt)", Relay, ec,
		"Wait between QStash's retries of a message (`Upstash-Retry-Delay`), 1s to 24h. Short (e.g. `10s`, the stack's default: a 30-second ladder with 3 retries) hands a consumer outage to the outbox sooner: the failure callback puts the event back and the relay holds its topic until a probe is delivered ([consumer outage](reliability.md#consumer-outage))."},
	{"OUTBOX_NAME", "QStash", "`" + qstash.DefaultName + "` (the template: the stack name)", Relay, ec,
		"The deployment's name, `[A-Za-z0-9_-]`, at most 128: in every deduplication id (`<name>-<id>`, `<name>-<id>-r<generation>`), the FIFO queue names and the flow-control keys, so deployments sharing a QStash account neither deduplicate nor block each other."},
	{"PUBLIC_BASE_URL", "QStash", "relay: required; webhook: the Function URL's origin", Relay | WebhookFunction, ec,
		"The webhook's public base URL. The relay publishes each event to `<base>/events/<topic>?outbox_id=<id>&generation=<n>`; the webhook checks that the signed URL starts with it (without it: `https://` + the Function URL's domain, never a client-supplied `Host`; served over net/http with `LISTEN_ADDR` there is no such domain, and the webhook refuses to start without it)."},
	{"FAILURE_CALLBACK_URL", "QStash", "relay: unset (no failure callback); failure function: the Function URL's origin and path", Relay | FailureFunction, ec,
		"The failure function's exact URL, without query or fragment (both functions refuse one at start). The relay sends it as `Upstash-Failure-Callback`; the failure function checks the signed URL against it. Without it on the relay, QStash's dead letters stay in its DLQ until `outboxctl dlq sync` records them."},
	{"ORDERING", "QStash", "`" + string(publish.OrderingPublish) + "`", Relay, ec,
		"`publish`: `/v2/batch` with flow control, parallel deliveries, order not kept; `fifo`: per-key order end to end through `FIFO_QUEUES` QStash queues (see [how the relay works](producing.md#ordering-modes-ordering))."},
	{"FIFO_QUEUES", "QStash", fmt.Sprint(qstash.DefaultFIFOQueues), Relay, ec,
		"Number of QStash queues `<OUTBOX_NAME>-0..N-1` in `fifo` ordering (queue = FNV-1a(partition key) mod N); at most the plan's queue count."},
	{"FLOW_CONTROL_PARALLELISM", "QStash", "unset", Relay, ec, "Per-key delivery parallelism (`publish` ordering only)."},
	{"FLOW_CONTROL_RATE", "QStash", "unset", Relay, ec, "Per-key deliveries per `FLOW_CONTROL_PERIOD` (`publish` ordering only)."},
	{"FLOW_CONTROL_PERIOD", "QStash", "unset (QStash's: 1s)", Relay, ec, "Period of `FLOW_CONTROL_RATE`, a duration such as `1s` or `1m`, at most " + dur(qstash.MaxFlowControlPeriod) + "."},

	{"BATCH_SIZE", "Relay", fmt.Sprint(relay.DefaultBatchSize), Relay, ec,
		"Rows per claim, at most " + fmt.Sprint(relay.MaxBatchSize) + ". Payload memory is bounded by `BATCH_BYTES` and `IN_FLIGHT_BYTES`, so large payloads need no smaller batch."},
	{"PUBLISH_CONCURRENCY", "Relay", fmt.Sprint(relay.DefaultPublishConcurrency), Relay, ec,
		"Batches in flight at once per relay (the next claim overlaps earlier publishes; 1 is strictly serial), each marked on a database connection of its own (the relay Lambda opens up to `PUBLISH_CONCURRENCY` + 2, one more while it waits for events (`IDLE_GAP`); `outboxctl relay` + 3, one more with retention); per-key order and leases hold for any value. At most " + fmt.Sprint(relay.MaxPublishConcurrency) + "."},
	{"BATCH_BYTES", "Relay", bytes(relay.DefaultMaxBatchBytes), Relay, ec,
		"Payload bytes one claim takes at most, as JSON text, whatever Postgres's compression (rows past it are given back, attempt uncounted); one larger event still goes, alone. At most `IN_FLIGHT_BYTES`."},
	{"IN_FLIGHT_BYTES", "Relay", "an eighth of `AWS_LAMBDA_FUNCTION_MEMORY_SIZE` (32 MiB at 256 MB); " + bytes(relay.DefaultMaxInFlightBytes) + " outside Lambda", Relay, ec,
		"Payload bytes of all batches in flight together; no claim while over it. A single event larger than this is dead-lettered at its claim: the relay could not hold it."},
	{"LEASE", "Relay", dur(relay.DefaultLease), Relay, ec,
		"How long a claimed row is invisible to other relays; must exceed `PUBLISH_TIMEOUT` + the mark timeout (" + dur(relay.DefaultMarkTimeout) + "), or a slow publish is reclaimed and sent twice."},
	{"PUBLISH_TIMEOUT", "Relay", dur(relay.DefaultPublishTimeout), Relay, ec, "One QStash request (also the drain's deadline margin with the mark timeout)."},
	{"MAX_ATTEMPTS", "Relay", fmt.Sprint(relay.DefaultMaxAttempts), Relay, ec, "The relay's retry budget per event; past it the event is dead-lettered."},
	{"BACKOFF_BASE", "Relay", dur(relay.DefaultBackoffBase), Relay, ec, "Backoff ceiling `min(BACKOFF_BASE·2^attempt, BACKOFF_MAX)`, full jitter, floor " + dur(relay.MinBackoff) + "."},
	{"BACKOFF_MAX", "Relay", dur(relay.DefaultBackoffMax), Relay, ec, "Cap of the backoff ceiling."},
	{"RELAY_FUNCTION", "Relay", "unset (no kick)", OutboxctlEnqueue, env(SourceOutboxctl),
		"The relay function's name or ARN (the stack's `RelayFunctionArn` output): `outboxctl enqueue` kicks it after each commit, as producers do with package `kick` (an asynchronous `Invoke`; AWS region and credentials from the environment, `AWS_ENDPOINT_URL_LAMBDA` honoured). The caller needs `lambda:InvokeFunction` on it."},
	{"IDLE_GAP", "Relay", dur(relayenv.DefaultIdleGap), Relay, ec,
		"How long an invocation waits for more events before it returns, closing every database session it opened (fast polls, then asleep on `LISTEN/NOTIFY`). A kicked invocation stays at least this long from its start; a scheduled one that finds the outbox empty returns at once. Producers that kick (`pkg/kick`) skip kicks within their interval (1s), which must not exceed it. At most 1m; `0s` drains once. Measured as deployed (docs/performance.md): with kicks, commit -> dispatched p50 4-15 ms, p99 18-142 ms; each kicked invocation holds its sessions `IDLE_GAP` after its last event; idle, no session at all between invocations."},

	{"OUTBOX_RETENTION", "Retention", dur(retention.DefaultOutboxRetention), Relay, ec, "Delete dispatched outbox rows older than this; must outlive the retry horizon."},
	{"DEDUPE_TTL", "Retention", dur(retention.DefaultDedupeTTL), Relay, ec,
		"Delete `processed_messages` older than this; refused at startup if shorter than the whole retry horizon (relay attempts × backoff + QStash retries × its backoff), with both numbers in the error."},

	{"MAX_BODY_BYTES", "Receivers", "webhook " + bytes(webhook.DefaultMaxBodyBytes) + ", failure function " + bytes(deadletter.DefaultCallbackMaxBodyBytes), Receivers, ec,
		"Largest request body; a larger one gets 489 + `Upstash-NonRetryable-Error: true` before it is read whole."},
	{"LISTEN_ADDR", "Receivers", "unset (a Lambda)", Receivers, ec, "Serve the same handler over `net/http` on this address instead of as a Lambda."},

	{"LOG_LEVEL", "Observability", "`info`", All, ec, "`debug`, `info`, `warn` or `error`."},
	{"METRICS_NAMESPACE", "Observability", "`" + metrics.DefaultNamespace + "`", All, ec, "CloudWatch namespace of the Embedded Metric Format lines."},
	otel("OTEL_EXPORTER_OTLP_ENDPOINT", "unset (tracing off)", "OTLP/HTTP collector; setting it turns tracing on (see [observability](observability.md))."),
	otel("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "unset", "Traces-only OTLP endpoint; also turns tracing on."),
	otel("OTEL_TRACES_EXPORTER", "`otlp` when an endpoint is set", "`otlp` turns tracing on; any other value turns it off."),
	otel("OTEL_SDK_DISABLED", "`false`", "`true` turns tracing off whatever else is set."),
	otel("OTEL_EXPORTER_OTLP_PROTOCOL", "`http/protobuf`", "Only `http/protobuf` is supported; anything else is a startup error."),
	otel("OTEL_SERVICE_NAME", "`outbox-relay` (both relays), `outbox-webhook`, `outbox-failure`", "Service name on the spans (read by the OpenTelemetry SDK)."),
	otel("OTEL_RESOURCE_ATTRIBUTES", "unset", "Extra resource attributes, as the OpenTelemetry specification says."),
	otel("OTEL_EXPORTER_OTLP_HEADERS", "unset", "Headers sent to the collector, as the specification says."),
	otel("OTEL_TRACES_SAMPLER", "`parentbased_always_on`", "Sampler: deliveries follow the producer's sampling decision by default."),
	otel("OTEL_TRACES_SAMPLER_ARG", "unset", "The sampler's argument (e.g. a ratio)."),

	{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "Lambda runtime", "set by Lambda (MB)", Relay, env(SourceEnvconfig, SourceRelayMain),
		"The function's memory: `IN_FLIGHT_BYTES` defaults to an eighth of it and `GOMEMLIMIT` to 80 %. Unset outside Lambda."},
	{"GOMEMLIMIT", "Lambda runtime", "80 % of `AWS_LAMBDA_FUNCTION_MEMORY_SIZE`", RelayFunction, env(SourceRelayMain),
		"Go's soft heap limit, set at cold start unless given, so a drain holding large batches is collected before Lambda kills it."},
	{"FUNCTION_TIMEOUT", "Lambda runtime", "unset (the template sets it from `RelayTimeout`)", RelayFunction, env(SourceRelayMain),
		"The function timeout in seconds: a timeout that leaves the drain less than its deadline margin is refused at cold start, naming both numbers."},
	{"AWS_LAMBDA_FUNCTION_TIMEOUT", "Lambda runtime", "set by the emulator and `sam local`", RelayFunction, env(SourceRelayMain), "Read as `FUNCTION_TIMEOUT` when that is unset."},
}

// planList formats one limit of the three plans as "free / payg / fixed".
func planList(limit func(qstash.PlanLimits) string) string {
	var out []string
	for _, p := range []qstash.Plan{qstash.PlanFree, qstash.PlanPayg, qstash.PlanFixed} {
		l, err := p.Limits()
		if err != nil {
			panic(err) // the three plans are the package's own
		}
		out = append(out, limit(l))
	}
	return strings.Join(out, " / ")
}

// dur formats d as the readers accept it: whole days as 7d, else Go's form without a zero tail.
func dur(d time.Duration) string {
	if d >= 24*time.Hour && d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	// Only whole zero units go ("1m0s" -> "1m", "1h0m0s" -> "1h"): "30s" keeps its 0.
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// bytes formats n with its binary unit when it has one: 8388608 (8 MiB).
func bytes(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d (%d MiB)", n, n>>20)
	}
	return fmt.Sprint(n)
}

// Regenerate is the command that writes docs/configuration.md.
const Regenerate = "go run ./cmd/outboxctl env > docs/configuration.md"

// Markdown writes the reference, docs/configuration.md: a short header, then one table per
// group.
func Markdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, header, Regenerate)
	for i, g := range Groups {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "## %s\n\n| variable | default | read by | what it does |\n| --- | --- | --- | --- |\n", g)
		for _, v := range Vars {
			if v.Group != g {
				continue
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", v.Name, cell(v.Default), v.ReadBy, cell(v.Doc))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

const header = `# Configuration

<!-- Generated from internal/envconfig/envdoc by ` + "`outboxctl env`" + `; do not edit. Regenerate: %s (or make docs). -->

Every environment variable the three functions and ` + "`outboxctl relay`" + ` read, its default and what it
does. Each reader reports every missing or invalid variable at once, each error naming its
variable, and refuses settings that contradict each other (a lease not above the publish
timeout, a ` + "`DEDUPE_TTL`" + ` inside the retry horizon) at startup. Durations are Go durations (` + "`30s`" + `,
` + "`15m`, `1h`" + `) or whole days (` + "`7d`" + `). In AWS the template sets these from its parameters and the
secrets come from Secrets Manager and SSM ([deploy](deploy.md)). *Read by* names the template's
functions (RelayFunction, WebhookFunction, FailureFunction) and ` + "`outboxctl relay`" + `; *all* is the four. The other ` + "`outboxctl`" + ` commands
that open the database read ` + "`DATABASE_URL`" + ` or the same ` + "`DB_*`" + ` references; which QStash to point
` + "`QSTASH_URL`" + ` at is in [the QStash contract](qstash-contract.md#which-qstash-upstash-the-official-dev-server-or-the-built-in-one).

`

// cell keeps a value inside its table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
