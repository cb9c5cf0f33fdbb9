// Package doccheck holds a test that every relative link and image in README.md and
// docs/*.md resolves: to a file that exists, and, with a #fragment, to a heading of that
// file as GitHub names its anchors. It has no code of its own.
package doccheck
