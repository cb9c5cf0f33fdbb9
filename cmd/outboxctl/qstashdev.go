package main

import (
	"context"
	"errors"
)

// runQStashDev is a placeholder until its issue lands.
func runQStashDev(ctx context.Context, e env, args []string) error {
	return errors.New("not implemented yet")
}
