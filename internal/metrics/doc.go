// Package metrics records the project's fixed set of metrics (Definitions) in two formats:
// CloudWatch Embedded Metric Format lines for the Lambdas (EMF), and a Prometheus text
// exposition for long-lived processes (Registry). Both take the same Event, so the two
// always carry the same counters and gauges.
//
// Dimensions are kept few, because every dimension set is a separate CloudWatch metric
// (and a separate bill): every event has the set [Function]; an event whose Topic is in
// the configured bounded set (the registered handlers' topics) also has [Function, Topic].
// A topic outside that set is kept as a plain log field, never as a dimension, so a
// sender cannot create metrics by inventing topic names.
package metrics
