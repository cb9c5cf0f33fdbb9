// Package relay drains the outbox: claim a batch under a lease, publish it outside any
// transaction, then record every outcome with one statement per kind, fenced by the lease.
//
// # How long a relay runs
//
// Drain returns once a batch comes back short. DrainIdle, what the relay Lambda runs for a
// producer's kick and for its scheduled tick, keeps draining while events keep arriving
// and returns an idle gap after the last one, its LISTEN session closed; Linger drains
// until a fixed time, Run until stopped (a long-lived process). All of them stop claiming
// Config.DeadlineMargin before their context's deadline and return only when every batch
// they claimed is marked.
//
// # Pipelining
//
// Up to Config.PublishConcurrency batches are in flight at once: while earlier batches wait
// for the queue's answer (a network round trip) or are being marked, the next claim runs.
// Claims are serial (one at a time per relay); each batch has its own lease, publishes and
// marks on its own, and Drain returns only when every batch it claimed is marked. Because a
// key in flight cannot be claimed again (below), a claim gives each key up to
// PublishConcurrency of its events, so a backlog over few keys still fills every batch in
// flight instead of two.
//
// # Per-key FIFO
//
// An event is never handed to the Publisher while an earlier event with the same partition
// key is pending (leased, backing off, or not yet due); it waits until that event is
// dispatched or dead-lettered. The claim enforces this across relays and across the batches
// of one relay (see outboxstore.Store.Claim): a key whose head is leased by a batch in flight is
// not claimed again. In fifo mode (Config.Ordering) a batch's events go out in successive
// Publish calls ("waves": the first event of every key, then the second, ...); when one
// fails, retryably or permanently, its key's later events are released unsent and wait
// until the failure is recorded, while other keys keep flowing. In publish mode the queue
// keeps no order anyway, so a batch is one Publish call, a key's events in id order inside.
//
// # Delayed events
//
// An event enqueued with a future AvailableAt is pending but not ready. It holds every later
// event of its key until it is due and published, as FIFO requires: a later event never
// overtakes it. Events of other keys are not held. The lateness gauge (`outboxctl status`,
// metric OldestPendingAgeSeconds) counts an event only from its AvailableAt and ignores the
// events a delay holds back, so a delay is not an alarm.
//
// # Deferred publishes
//
// A Result whose error is a *DeferError (a used-up quota, a wrong endpoint or token) was not
// attempted: the row goes back to pending with its attempt uncounted, nothing is
// dead-lettered, the rest of the batch goes back too, and the relay claims nothing until
// the DeferError's Until (or a pause that doubles from Config.DeferPause when it names
// none). When that lies beyond what the drain's deadline allows, Drain stops early
// (Stats.PausedUntil) instead of claiming and deferring again.
//
// # Undecodable rows
//
// A claimed row that cannot become a Message (headers that are not a JSON object of string
// values, written around Enqueue) is dead-lettered alone with the reason; the rest of its
// batch is published, and its key's later events wait until the dead letter is recorded.
package relay
