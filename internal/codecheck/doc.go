// Package codecheck holds tests that hold the library's source to the house limits: no
// function in pkg/ or internal/ longer than MaxFuncLines. It has no code of its own.
package codecheck
