// Package gosrc lists the module's Go source for the tests that read it as text or syntax
// (internal/apicheck, internal/codecheck, internal/envconfig/envdoc): the files a build of
// its packages compiles.
package gosrc

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
)

// Files returns the path of every .go file below dir that is not a test file, testdata
// directories left out, in lexical order.
func Files(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list the Go files below %s: %w", dir, err)
	}
	return out, nil
}
