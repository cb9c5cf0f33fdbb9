// Command relay is the scheduled relay Lambda: each invocation drains the outbox through
// QStash ({"task":"drain"}, also what an EventBridge envelope without Input means), runs
// retention ({"task":"retention"}), or records QStash DLQ entries missing from dead_letters
// ({"task":"dlq-sync"}), writes one EMF metrics line, and returns its counts.
//
// Environment: `outboxctl env` (docs/configuration.md) lists every variable it reads;
// DATABASE_URL (or DB_SECRET_ARN), QSTASH_TOKEN (or QSTASH_TOKEN_PARAM) and PUBLIC_BASE_URL
// are required. The cold start and the handler are package relayfunc.
package main

import "github.com/outbox-relay/outbox-relay/v3/internal/relayfunc"

func main() { relayfunc.Main() }
