package main

import (
	"context"
	"fmt"

	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig/envdoc"
)

// runEnv prints the reference of every environment variable (package envdoc) as markdown:
// docs/configuration.md is this output, and a test keeps the two equal.
func runEnv(_ context.Context, e env, args []string) error {
	fs := newFlagSet(e, "env").withUsage(fmt.Sprintf("usage: outboxctl env [--names]\n\nPrints every environment variable the functions and outboxctl relay read: default, readers, meaning\n(markdown; docs/configuration.md is this output: %s).", envdoc.Regenerate))
	names := fs.Bool("names", false, "print only the variable names, one per line")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *names {
		for _, v := range envdoc.Vars {
			if _, err := fmt.Fprintln(e.stdout, v.Name); err != nil {
				return fmt.Errorf("write names: %w", err)
			}
		}
		return nil
	}
	if err := envdoc.Markdown(e.stdout); err != nil {
		return fmt.Errorf("write reference: %w", err)
	}
	return nil
}
