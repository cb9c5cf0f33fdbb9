// Package console is the operator console of outboxctl ui: a small web application served
// by the CLI next to the database, with three pages.
//
//   - Overview: the figures of outboxctl status (internal/health, the same code), a server-side
//     SVG chart of pending events, oldest pending age and dispatches per minute over the
//     last hours, unresolved dead letters by source and topic (or by failure group), and the
//     xmin horizon warning. The report and the chart are read in one snapshot: the chart
//     takes the report's pending count instead of reading the backlog again, and keeps the
//     figures of finished buckets in memory (chartCache), so a page reads only the minutes
//     since the last one.
//   - Dead letters: a filtered, keyset-paginated list, the failure groups of a filter
//     (deadletter.Groups, as outboxctl dlq list --groups), a letter's detail with its group,
//     and redrive of one letter, a selection, a whole filter or a failure group, always
//     after a dry-run count. Redrive calls
//     deadletter.Plan and deadletter.Redrive, as outboxctl dlq redrive does: one
//     transaction, the outbox row back to pending with its generation bumped, the letter
//     resolved.
//   - Event: one outbox row by id, its dedupe records, its dead letters, and the trace id of
//     its traceparent header.
//
// Safety: the console is read-only unless Config.AllowRedrive is set. Every action is a
// POST carrying a CSRF token (an HMAC, under a per-process random key, of a random
// per-browser cookie; compared in constant time). With a Token set every request must
// carry it, as "Authorization: Bearer <token>" or through the login form, which sets an
// HttpOnly, SameSite=Strict cookie; CheckListen refuses a non-loopback address without a
// token. Pages send a Content-Security-Policy without inline scripts or styles, deny
// framing, and action responses are not stored. No statement is built from request input:
// filters are parameters of fixed statements (queries.go).
//
// Everything (templates, CSS, JS) is embedded; the chart is SVG rendered on the server,
// so the console needs no network access beyond the database.
package console
