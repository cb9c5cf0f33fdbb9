// Package apicheck holds tests over the source of the public packages: what a reader of the
// package documentation sees must be there, so the check fails when a new exported name
// arrives without its doc comment.
package apicheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/gosrc"
)

// TestExportedNamesDocumented fails with the list of exported identifiers in pkg/ (types,
// funcs, methods on exported types, consts, vars) that have no doc comment, or whose doc
// comment does not start with the name, as go doc and pkg.go.dev show it.
func TestExportedNamesDocumented(t *testing.T) {
	t.Parallel()
	var problems []string
	walkLibrary(t, func(path, rel string) {
		problems = append(problems, checkFile(t, path, rel)...)
	})
	if len(problems) > 0 {
		sort.Strings(problems)
		t.Errorf("%d exported names in pkg/ without a proper doc comment:\n%s",
			len(problems), strings.Join(problems, "\n"))
	}
}

// walkLibrary calls fn for every non-test Go file under pkg/ (testdata excluded), with its
// path and its slash-separated path relative to the module root.
func walkLibrary(t *testing.T, fn func(path, rel string)) {
	t.Helper()
	root := filepath.Join("..", "..")
	files, err := gosrc.Files(filepath.Join(root, "pkg"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range files {
		rel, _ := filepath.Rel(root, path)
		fn(path, filepath.ToSlash(rel))
	}
}

// checkFile returns one line per undocumented exported name in the file at path.
func checkFile(t *testing.T, path, rel string) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	if err != nil {
		t.Fatalf("parse %s: %v", rel, err)
	}
	var out []string
	report := func(pos token.Pos, name, what string) {
		out = append(out, fmt.Sprintf("%s:%d: %s: %s", rel, fset.Position(pos).Line, name, what))
	}
	check := func(pos token.Pos, name string, doc *ast.CommentGroup) {
		switch {
		case doc == nil || strings.TrimSpace(doc.Text()) == "":
			report(pos, name, "no doc comment")
		case !startsWithName(doc.Text(), name):
			report(pos, name, "doc comment does not start with the name")
		}
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			name := d.Name.Name
			if d.Recv != nil {
				recv := receiverType(d.Recv)
				if !ast.IsExported(recv) {
					continue // a method of an unexported type is not in the docs
				}
				name = recv + "." + name
			}
			check(d.Pos(), name, d.Doc)
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					doc := s.Doc
					if doc == nil && !d.Lparen.IsValid() {
						doc = d.Doc
					}
					check(s.Pos(), s.Name.Name, doc)
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if !n.IsExported() {
							continue
						}
						switch {
						case s.Doc != nil:
							check(n.Pos(), n.Name, s.Doc)
						case s.Comment != nil:
							// A trailing line comment in a block documents its entry.
						case d.Lparen.IsValid() && d.Doc != nil:
							// A block's doc comment covers its entries (an enumeration).
						case d.Doc != nil:
							check(n.Pos(), n.Name, d.Doc)
						default:
							report(n.Pos(), n.Name, "no doc comment")
						}
					}
				}
			}
		}
	}
	return out
}

// startsWithName reports whether a doc comment begins with name (or its last part, for a
// method), allowing the article that Go's own docs allow before a type name.
func startsWithName(text, name string) bool {
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		name = name[i+1:]
	}
	for _, prefix := range []string{"", "A ", "An ", "The "} {
		rest, ok := strings.CutPrefix(text, prefix+name)
		if ok && (rest == "" || !isIdentChar(rest[0])) {
			return true
		}
	}
	return false
}

func isIdentChar(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// receiverType is the name of a method's receiver type, without pointer or type parameters.
func receiverType(fl *ast.FieldList) string {
	expr := fl.List[0].Type
	for {
		switch e := expr.(type) {
		case *ast.StarExpr:
			expr = e.X
		case *ast.IndexExpr:
			expr = e.X
		case *ast.IndexListExpr:
			expr = e.X
		case *ast.Ident:
			return e.Name
		default:
			return ""
		}
	}
}
