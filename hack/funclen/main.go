// Command funclen lists the functions of the module's production code (Go
// files that are not tests) longer than a limit, for make lint: a function
// that outgrows a screen and a half wants splitting, unless it is a table
// (hack/lint-exceptions.txt names those, with their reasons).
//
//	go run ./hack/funclen [-max 100] dir...
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	limit := flag.Int("max", 100, "longest function allowed, in lines from func to its closing brace")
	flag.Parse()
	for _, root := range flag.Args() {
		long, err := longFunctions(root, *limit)
		if err != nil {
			fmt.Fprintln(os.Stderr, "funclen:", err)
			os.Exit(2)
		}
		for _, l := range long {
			fmt.Println(l)
		}
	}
}

// longFunctions walks root's Go files (tests, testdata and hidden folders
// left out) and describes each function over limit lines as
// "path:line: name is N lines".
func longFunctions(root string, limit int) ([]string, error) {
	var out []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			start, end := fset.Position(fn.Pos()), fset.Position(fn.End())
			if n := end.Line - start.Line + 1; n > limit {
				out = append(out, fmt.Sprintf("%s:%d: %s is %d lines", filepath.ToSlash(path), start.Line, funcName(fn), n))
			}
		}
		return nil
	})
	return out, err
}

// funcName is Recv.Name for a method, Name for a function.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}
