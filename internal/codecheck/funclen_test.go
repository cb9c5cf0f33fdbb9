package codecheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/gosrc"
)

// maxFuncLines is the longest a function may be, counted from its func line to its closing
// brace: past it, a function does several things that each deserve a name (and, when they
// are pure, a table test).
const maxFuncLines = 80

// root is the repository, from this package's directory.
var root = filepath.Join("..", "..")

// TestNoLongFunctions lists every function of pkg/ and internal/ (test files excluded)
// longer than maxFuncLines.
func TestNoLongFunctions(t *testing.T) {
	t.Parallel()
	var offenders []string
	checked := 0
	for _, dir := range []string{"pkg", "internal"} {
		files, err := gosrc.Files(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			long, err := longFuncs(path, nil, maxFuncLines)
			if err != nil {
				t.Fatal(err)
			}
			offenders = append(offenders, long...)
		}
		checked += len(files)
	}
	if checked < 50 {
		t.Fatalf("checked only %d files: is root (%s) the repository?", checked, root)
	}
	if len(offenders) > 0 {
		slices.Sort(offenders)
		t.Errorf("%d functions are longer than %d lines; split each into named steps:\n%s",
			len(offenders), maxFuncLines, strings.Join(offenders, "\n"))
	}
}

// longFuncs returns "path:line name (n lines)" for each function of the file (src, or
// read from path when nil) longer than limit.
func longFuncs(path string, src any, limit int) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	if ast.IsGenerated(f) {
		return nil, nil
	}
	var out []string
	for _, decl := range f.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
		if n := end.Line - start.Line + 1; n > limit {
			rel, _ := filepath.Rel(root, path)
			out = append(out, fmt.Sprintf("%s:%d %s (%d lines)", filepath.ToSlash(rel), start.Line, funcName(fd), n))
		}
	}
	return out, nil
}

// funcName is fd's name with its receiver type, as in (*Relay).drain.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	if idx, ok := typ.(*ast.IndexExpr); ok { // a generic receiver: T[P]
		typ = idx.X
	}
	switch r := typ.(type) {
	case *ast.StarExpr:
		return fmt.Sprintf("(*%s).%s", exprName(r.X), fd.Name.Name)
	default:
		return fmt.Sprintf("%s.%s", exprName(r), fd.Name.Name)
	}
}

func exprName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.IndexExpr:
		return exprName(x.X)
	case *ast.IndexListExpr:
		return exprName(x.X)
	}
	return fmt.Sprintf("%T", e)
}

// TestLongFuncsCounts pins the counting rule on a made-up file: the func line through the
// closing brace, doc comment excluded, methods named with their receiver.
func TestLongFuncsCounts(t *testing.T) {
	t.Parallel()
	body := func(n int) string { return strings.Repeat("\t_ = 0\n", n) }
	src := "package p\n\n// doc\n// comment\nfunc short() {\n" + body(2) + "}\n\n" +
		"type T struct{}\n\nfunc (t *T) atLimit() {\n" + body(3) + "}\n\n" +
		"func (T) over() {\n" + body(4) + "}\n\nfunc bodyless()\n"
	got, err := longFuncs(filepath.Join(root, "p", "p.go"), src, 5)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"p/p.go:18 T.over (6 lines)"}
	if !slices.Equal(got, want) {
		t.Errorf("longFuncs = %q, want %q", got, want)
	}
}
