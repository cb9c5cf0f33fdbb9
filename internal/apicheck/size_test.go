package apicheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// maxExported bounds what pkg/ exports (issue 30): a user imports the library to produce,
// run the relay, consume, handle dead letters, migrate and test against the local QStash,
// and should be able to hold that API in their head. What only this project's functions
// and CLI need belongs in internal/. Raise it only for a name a user calls: issue 41 added
// 13 (the producer's kick, package kick, and outbox.BeginFunc that kicks after the commit;
// relay.DrainIdle, which a relay run as a Lambda of the user's own calls); issue 43 added
// 11 in deadletter (DeliveryFailure.Permanent, and Reopen with its result and states: what a
// failure callback of the user's own does with a transient final failure, as dlq sync and
// the stack's callback do; the circuit's ProbeSchedule and its defaults) and 5 in webhook and
// relay (webhook.Later, HandlerTimeout, SharesOutbox; relay.Config.MaxDeaths with its
// default, issue 40); issue 42 added webhook.OriginFromFunctionURL and MaxReasonBytes;
// issue 41's second round relay.DrainAwake (what such a relay calls so producers' kickers
// see it draining).
const maxExported = 381

// TestExportedNamesBounded counts the exported names of pkg/ as issue 30 counts them
// (types, funcs, methods on exported types, consts, vars; test files excluded) and fails
// above maxExported, printing the count of every package.
func TestExportedNamesBounded(t *testing.T) {
	t.Parallel()
	perPkg := map[string]int{}
	total := 0
	walkLibrary(t, func(file, rel string) {
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("parse %s: %v", rel, err)
		}
		n := len(exportedNames(f))
		perPkg[path.Dir(rel)] += n
		total += n
	})
	if total == 0 {
		t.Fatal("no exported names found under pkg/: the walk is broken")
	}
	var lines []string
	for _, dir := range slices.Sorted(maps.Keys(perPkg)) {
		lines = append(lines, fmt.Sprintf("%4d %s", perPkg[dir], dir))
	}
	report := strings.Join(lines, "\n")
	if total > maxExported {
		t.Errorf("pkg/ exports %d names, more than %d: move what only this project uses to internal/, or unexport it\n%s",
			total, maxExported, report)
	}
	t.Logf("pkg/ exports %d names\n%s", total, report)
}

// exportedNames lists the file's exported types, funcs, methods of exported types
// (Type.Method), consts and vars.
func exportedNames(f *ast.File) []string {
	var out []string
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				out = append(out, d.Name.Name)
			} else if recv := receiverType(d.Recv); ast.IsExported(recv) {
				out = append(out, recv+"."+d.Name.Name)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						out = append(out, s.Name.Name)
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							out = append(out, n.Name)
						}
					}
				}
			}
		}
	}
	return out
}

// TestNoInternalTypeInLibraryAPI fails when an exported declaration in pkg/ names a type of
// an internal package in its signature, fields or type: a user of the library could not
// name that type, so the API could not be used in full (e.g. a field of a config struct).
func TestNoInternalTypeInLibraryAPI(t *testing.T) {
	t.Parallel()
	var problems []string
	walkLibrary(t, func(file, rel string) {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("parse %s: %v", rel, err)
		}
		internal := map[string]bool{} // local names of the file's internal imports
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !strings.Contains(p, "/internal/") && !strings.HasSuffix(p, "/internal") {
				continue
			}
			name := path.Base(p)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			internal[name] = true
		}
		if len(internal) == 0 {
			return
		}
		for _, expr := range apiTypeExprs(f) {
			ast.Inspect(expr, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if id, ok := sel.X.(*ast.Ident); ok && internal[id.Name] {
					problems = append(problems, fmt.Sprintf("%s:%d: %s.%s",
						rel, fset.Position(sel.Pos()).Line, id.Name, sel.Sel.Name))
				}
				return true
			})
		}
	})
	if len(problems) > 0 {
		t.Errorf("exported API in pkg/ names internal types:\n%s", strings.Join(problems, "\n"))
	}
}

// apiTypeExprs returns the type expressions a user of the file's exported declarations
// sees: signatures of exported funcs and of methods of exported types, the definitions of
// exported types (an unexported field of a struct is left out), and the declared types of
// exported consts and vars. Values (a const's initializer) are not types and are skipped.
func apiTypeExprs(f *ast.File) []ast.Expr {
	var out []ast.Expr
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || d.Recv != nil && !ast.IsExported(receiverType(d.Recv)) {
				continue
			}
			out = append(out, d.Type)
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						out = append(out, exportedParts(s.Type)...)
					}
				case *ast.ValueSpec:
					if s.Type != nil && slices.ContainsFunc(s.Names, (*ast.Ident).IsExported) {
						out = append(out, s.Type)
					}
				}
			}
		}
	}
	return out
}

// exportedParts is t without the unexported fields of a struct type (embedded fields
// count as exported when their type name is).
func exportedParts(t ast.Expr) []ast.Expr {
	st, ok := t.(*ast.StructType)
	if !ok {
		return []ast.Expr{t}
	}
	var out []ast.Expr
	for _, field := range st.Fields.List {
		if len(field.Names) == 0 || slices.ContainsFunc(field.Names, (*ast.Ident).IsExported) {
			out = append(out, field.Type)
		}
	}
	return out
}
