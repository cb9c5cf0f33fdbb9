// Package bench measures the relay and the consumers against this machine's own limits.
//
// Every scenario is a function that takes a context, the URL of a migrated schema (see
// postgres.CreateSchema: the search_path is part of the URL, so a scenario never touches user tables)
// and a config sized by ConfigFor-style helpers (Tiny for tests, Short for CI and quick
// checks, Full for the published numbers), and returns typed results. Headline figures are
// ratios of two things measured in the same run (relay vs the bare claim+mark floor, relay
// vs the article's algorithm, webhook vs its raw transaction), because absolute numbers on
// shared machines drift between runs; absolute numbers are reported with Machine.
//
// Tables are loaded with COPY and then VACUUM ANALYZEd before every timed drain: the relay
// runs against tables autovacuum keeps analysed, and a never-analysed table makes the
// planner pick plans about 3x slower (pkg/relay's BenchmarkDrain), which would measure the
// planner, not the relay.
//
// Nothing here asserts a time: targets are reported (Summary, Targets), never enforced.
package bench
