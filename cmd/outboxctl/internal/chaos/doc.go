// Package chaos proves the pipeline's promises under faults: nothing lost, nothing applied
// twice, per-key order in fifo mode, poison isolated. Run starts the whole pipeline in one
// process against real Postgres (producers in business transactions, several relays, the
// local QStash server, the webhook and the failure-callback recorder), injects every
// fault of Faults at its rate, switches the faults off once most events have settled,
// waits for the rest, and then Check reads the invariants from the database, never from
// in-memory counters.
//
// Faults and where they are injected:
//   - relay crash after claim / after publish: the relay's publisher calls runtime.Goexit,
//     so the goroutine dies with its lease and nothing after the publish runs;
//   - relay killed with several batches in flight (relays pipeline, default PublishConcurrency):
//     the publisher marks its relay dead and every Publish call of it in flight or still
//     to come ends in runtime.Goexit, published or not, so none of those batches is marked;
//   - slow publish: the publish is held past the lease and then sent anyway;
//   - publish 500 / 429 / accepted-then-response-dropped: the local QStash server's own
//     seeded faults; connection reset: a front in front of it resets the TCP connection
//     (SO_LINGER 0) before QStash sees the request;
//   - delivery duplicated after success: QStash's; delivery delayed: held in front of the
//     webhook (where it can be counted), which reorders deliveries not in one FIFO queue;
//   - consumer 500 before or after its side effect, and a committed delivery whose 200 is
//     replaced by a 500 (the answer lost);
//   - poison events the handler rejects permanently (amount 0);
//   - pg_terminate_backend on every backend of one relay's pool (found by its
//     application_name) while it drains;
//   - business transactions that enqueue and then roll back.
//
// In the deployed shape (Options.Lambda) the relays are the relay function's own handler
// (internal/relayfunc) in execution environments behind the local Lambda service
// (internal/lambdasvc), woken by the producers' kicks (package kick, through the Invoke
// API) and by a schedule, the backstop. A fault that kills a relay "process" kills its
// environment; the next invocation starts another. Three more faults:
//   - a producer dies between its commit and its kick (the kick is never requested);
//   - a kick accepted (202) and lost: a front on the Invoke API answers and drops it, which
//     also leaves the kicker's promise in the database with no relay behind it, so other
//     producers skip their kicks until it ends;
//   - a kick refused (429 TooManyRequestsException or 500 ServiceException).
//
// Whatever a lost kick leaves behind, the next scheduled tick must deliver it.
//
// Reproducibility: each fault source draws from its own PCG stream of the seed, so the
// sequence of decisions of each source is the same for a seed. Which batch or delivery
// meets which decision depends on goroutine scheduling, so two runs with one seed inject
// the same kinds at the same rates, but not at exactly the same events.
//
// Why a healthy event is not dead-lettered: the relay retries every retryable failure up
// to MaxAttempts claims (default 40) and QStash every failed delivery QStashRetries times
// (default 12). With the default rates, about one claim in ten meets a relay or publish
// fault and about one delivery in sixteen a consumer fault, so the chance that one event
// exhausts either budget is below 0.1^40 + 0.06^13, about 1e-16: zero in practice at
// any run size. Backoffs do not take real minutes: the relays' clock (relay.Config.Now)
// runs ClockSpeed times faster than real time, and the QStash server's TimeScale shrinks
// its e^(2.5n) s delays.
package chaos
