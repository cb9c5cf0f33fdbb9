// Package migrations holds the forward-only SQL schema, embedded so the CLI and tests apply
// exactly the files that ship. Each file also runs under plain `psql -f` in name order
// (goose annotations are SQL comments).
package migrations

import "embed"

// FS holds every NNNN_name.sql file of this directory.
//
//go:embed *.sql
var FS embed.FS
