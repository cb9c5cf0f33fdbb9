// Package postgres owns the schema's life cycle: Migrate applies the embedded forward-only
// migrations (package migrations) under an advisory lock, so concurrent deploys are safe,
// with every lock wait bounded and retried, so a live deployment's writers keep going;
// Status reports them; CreateSchema makes a throwaway migrated schema of its own on a
// shared server (tests, benchmarks, the local stack), whose URL carries the search_path.
// The Lambdas' connection pools and secrets live in internal/awsenv.
package postgres
