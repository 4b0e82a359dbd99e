package test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// walkSection is the heading of the section of docs/architecture.md whose
// Go names TestWalkNamesExist holds to the code.
const walkSection = "## A newcomer's walk"

// walkMinNames is the fewest names the walk must hold: an emptied or
// truncated walk fails rather than passing with nothing checked.
const walkMinNames = 100

// The forms of a Go name in the walk: pkg.(*Type).Method, pkg.Type.Member
// and pkg.Name, where pkg is a package of this module by its path from the
// module's root, or by the last element of that path when no other package
// ends in it.
var (
	walkPtrMethod = regexp.MustCompile(`^([a-z][a-z0-9_]*)\.\(\*([A-Za-z_][A-Za-z0-9_]*)\)\.([A-Za-z_][A-Za-z0-9_]*)$`)
	walkMember    = regexp.MustCompile(`^([a-z][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)$`)
	walkTopLevel  = regexp.MustCompile(`^([a-z][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)$`)
	walkBackticks = regexp.MustCompile("`([^`]+)`")
)

// TestWalkNamesExist reads docs/architecture.md's newcomer's walk and
// checks that every Go name it writes in backticks names a declaration of
// this module's non-test code: pkg.Name a top-level function, type,
// variable or constant; pkg.(*Type).Method a method of *Type (pointer or
// value receiver); pkg.Type.Member a value-receiver method of Type, a
// method of interface Type or a field of struct Type. Subjects, file names
// and other text in backticks (holding '/', '<' or a space, ending in
// ".go", or without a dot) are not names and are skipped; anything else
// with a dot that is not of one of the forms fails, so a mistyped name
// cannot pass as text.
func TestWalkNamesExist(t *testing.T) {
	names := walkNames(t)
	if len(names) < walkMinNames {
		t.Fatalf("the walk names %d Go names, want at least %d: is the section %q complete?", len(names), walkMinNames, walkSection)
	}
	pkgs := walkPackages(t)
	decls := map[string]*walkDecls{} // package directory → its declarations
	for _, n := range names {
		if err := walkResolve(n, pkgs, decls); err != nil {
			t.Errorf("docs/architecture.md, %q: `%s`: %v", walkSection, n, err)
		}
	}
}

// walkNames returns the backticked spans of the walk that are Go names,
// in order, each once.
func walkNames(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "\n"+walkSection+"\n")
	if !ok {
		t.Fatalf("docs/architecture.md has no section %q", walkSection)
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	var names []string
	for _, m := range walkBackticks.FindAllStringSubmatch(rest, -1) {
		s := m[1]
		if !strings.Contains(s, ".") || strings.ContainsAny(s, "/< ") || strings.HasSuffix(s, ".go") {
			continue // a subject, a file, a flag, a field or plain text
		}
		if !slices.Contains(names, s) {
			names = append(names, s)
		}
	}
	return names
}

// walkPackages returns the module's packages with non-test Go files: the
// directory of each by its path from the module's root and, where no other
// package's path ends in the same element, by that last element; an
// element two packages end in maps to "" (ambiguous).
func walkPackages(t *testing.T) map[string]string {
	t.Helper()
	byPath := map[string]string{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != ".." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			rel, err := filepath.Rel("..", filepath.Dir(path))
			if err != nil {
				return err
			}
			byPath[filepath.ToSlash(rel)] = filepath.Dir(path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	pkgs := map[string]string{}
	for rel, dir := range byPath {
		pkgs[rel] = dir
	}
	for rel, dir := range byPath {
		last := rel[strings.LastIndexByte(rel, '/')+1:]
		if _, isPath := byPath[last]; isPath || last == rel {
			continue // the path itself names a package
		}
		if _, seen := pkgs[last]; seen {
			pkgs[last] = "" // two packages end in it
			continue
		}
		pkgs[last] = dir
	}
	return pkgs
}

// walkDecls is what one package's non-test files declare.
type walkDecls struct {
	top     map[string]bool            // functions, types, variables, constants
	ptr     map[string]map[string]bool // type → methods of *type (either receiver)
	val     map[string]map[string]bool // type → value-receiver methods, interface methods, struct fields
	types   map[string]bool
	pkgName string
}

// walkParse reads the declarations of the package in dir.
func walkParse(dir string) (*walkDecls, error) {
	d := &walkDecls{top: map[string]bool{}, ptr: map[string]map[string]bool{}, val: map[string]map[string]bool{}, types: map[string]bool{}}
	add := func(m map[string]map[string]bool, typ, name string) {
		if m[typ] == nil {
			m[typ] = map[string]bool{}
		}
		m[typ][name] = true
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		d.pkgName = f.Name.Name
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Recv == nil || len(decl.Recv.List) == 0 {
					d.top[decl.Name.Name] = true
					continue
				}
				typ, ptr := walkRecv(decl.Recv.List[0].Type)
				add(d.ptr, typ, decl.Name.Name) // *T's method set holds both
				if !ptr {
					add(d.val, typ, decl.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					switch spec := spec.(type) {
					case *ast.TypeSpec:
						typ := spec.Name.Name
						d.top[typ], d.types[typ] = true, true
						switch st := spec.Type.(type) {
						case *ast.StructType:
							for _, fld := range st.Fields.List {
								for _, n := range fld.Names {
									add(d.val, typ, n.Name)
								}
								if len(fld.Names) == 0 { // embedded: named by its type
									if emb, _ := walkRecv(fld.Type); emb != "" {
										add(d.val, typ, emb)
									}
								}
							}
						case *ast.InterfaceType:
							for _, m := range st.Methods.List {
								for _, n := range m.Names {
									add(d.val, typ, n.Name)
									add(d.ptr, typ, n.Name)
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range spec.Names {
							d.top[n.Name] = true
						}
					}
				}
			}
		}
	}
	return d, nil
}

// walkRecv returns the type name of a receiver (or an embedded field's
// type) and whether it is a pointer.
func walkRecv(e ast.Expr) (string, bool) {
	ptr := false
	if s, ok := e.(*ast.StarExpr); ok {
		e, ptr = s.X, true
	}
	switch x := e.(type) {
	case *ast.IndexExpr: // a generic type's receiver: T[K]
		e = x.X
	case *ast.IndexListExpr: // T[K, V]
		e = x.X
	}
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name, ptr
	case *ast.SelectorExpr:
		return x.Sel.Name, ptr
	}
	return "", ptr
}

// walkResolve reports why name does not name a declaration of the module,
// or nil when it does. decls caches parsed packages by directory.
func walkResolve(name string, pkgs map[string]string, decls map[string]*walkDecls) error {
	var pkg, typ, member string
	ptr := false
	switch {
	case walkPtrMethod.MatchString(name):
		m := walkPtrMethod.FindStringSubmatch(name)
		pkg, typ, member, ptr = m[1], m[2], m[3], true
	case walkMember.MatchString(name):
		m := walkMember.FindStringSubmatch(name)
		pkg, typ, member = m[1], m[2], m[3]
	case walkTopLevel.MatchString(name):
		m := walkTopLevel.FindStringSubmatch(name)
		pkg, member = m[1], m[2]
	default:
		return fmt.Errorf("not a Go name of the forms pkg.Name, pkg.(*Type).Method or pkg.Type.Member (write a subject with <...>)")
	}
	dir, ok := pkgs[pkg]
	switch {
	case !ok:
		return fmt.Errorf("no package %q in the module", pkg)
	case dir == "":
		return fmt.Errorf("package %q is ambiguous: more than one package's path ends in it", pkg)
	}
	d := decls[dir]
	if d == nil {
		var err error
		if d, err = walkParse(dir); err != nil {
			return err
		}
		decls[dir] = d
	}
	switch {
	case typ == "":
		if !d.top[member] {
			return fmt.Errorf("package %s (%s) declares no %s outside its tests", pkg, d.pkgName, member)
		}
	case !d.types[typ]:
		return fmt.Errorf("package %s (%s) declares no type %s outside its tests", pkg, d.pkgName, typ)
	case ptr && !d.ptr[typ][member]:
		return fmt.Errorf("*%s.%s has no method %s", pkg, typ, member)
	case !ptr && !d.val[typ][member]:
		if d.ptr[typ][member] {
			return fmt.Errorf("%s.%s has %s on a pointer receiver: write %s.(*%s).%s", pkg, typ, member, pkg, typ, member)
		}
		return fmt.Errorf("%s.%s has no value-receiver method, interface method or field %s", pkg, typ, member)
	}
	return nil
}
