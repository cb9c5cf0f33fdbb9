// Package e2e holds end-to-end tests of the whole pipeline against real Postgres and the
// local QStash server: producer transaction -> relay -> QStash -> webhook -> inbox, and
// poison event -> 489 -> failure callback -> dead letter -> redrive -> delivery.
// It has no non-test code.
package e2e
