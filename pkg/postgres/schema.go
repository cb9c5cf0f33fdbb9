package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Schema is a schema of its own on a shared server, for a test, a benchmark or a local
// stack that must not see (or leave behind) anyone else's rows.
type Schema struct {
	// Name is <prefix>_<random hex>.
	Name string
	// URL connects with search_path set to Name, so child processes inherit the schema
	// with the URL.
	URL  string
	base string
}

// CreateSchema creates <prefix>_<random hex> on the server of baseURL and, when migrate
// is true, applies the migrations to it (logging to logger, which may be nil). Drop
// removes it.
func CreateSchema(ctx context.Context, baseURL, prefix string, migrate bool, logger *slog.Logger) (*Schema, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("name schema: %w", err)
	}
	name := prefix + "_" + hex.EncodeToString(b[:])
	url, err := withSearchPath(baseURL, name)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", name, err)
	}
	s := &Schema{Name: name, URL: url, base: baseURL}
	if !migrate {
		return s, nil
	}
	pool, err := pgxpool.New(ctx, url)
	if err == nil {
		defer pool.Close()
		_, err = Migrate(ctx, pool, logger)
	}
	if err != nil {
		_ = s.Drop(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("migrate schema %s: %w", name, err)
	}
	return s, nil
}

// Drop removes the schema and everything in it.
func (s *Schema) Drop(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.base)
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{s.Name}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", s.Name, err)
	}
	return nil
}

// withSearchPath returns url with search_path set to schema as a pgx runtime parameter
// (pgx sends unknown URL parameters to the server as settings).
func withSearchPath(url, schema string) (string, error) {
	if _, err := pgx.ParseConfig(url); err != nil {
		return "", fmt.Errorf("parse database url: %w", err)
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema, nil
}
