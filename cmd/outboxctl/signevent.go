package main

import (
	"context"
	"errors"
)

// runSignEvent is a placeholder until its issue lands.
func runSignEvent(ctx context.Context, e env, args []string) error {
	return errors.New("not implemented yet")
}
