package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// An Op names a mutation operator: the kind of fault a Mutant plants.
type Op string

// The operators. Each one changes a single token or statement; see the
// package documentation for what each covers.
const (
	OpComparison Op = "comparison" // < <= > >= == != turned into a neighbour
	OpLogical    Op = "logical"    // && and || swapped
	OpNegateIf   Op = "negate-if"  // if c → if !(c)
	OpArithmetic Op = "arithmetic" // + and -, += and -=, ++ and -- swapped
	OpRemove     Op = "remove"     // a store or a call statement deleted
	OpErrReturn  Op = "err-return" // if err != nil { return ..., err } never taken
	OpBool       Op = "bool"       // true and false swapped
	OpInt        Op = "int"        // an integer literal n → n+1
)

// formattingMethods are the methods whose code only formats a value for
// humans. Tests rarely pin their exact output, and faults there do not
// change what the driver does, so they are not mutated at all.
var formattingMethods = map[string]bool{"String": true, "Error": true, "GoString": true, "Format": true}

// A Mutant is one fault: the bytes Start:End of a file's original source
// replaced by After. Everything else in the file stays byte-identical, so
// line numbers and formatting in compiler errors and stack traces still
// match the file on disk.
type Mutant struct {
	File       string // the file, relative to the module root, with slashes
	Line, Col  int    // where the replaced text starts; Col counts bytes from 1
	Start, End int    // the replaced bytes of the original source
	Op         Op
	Func       string // the declaration it is in: f, T.m, (*T).m, or var v for a package-level initializer
	Before     string // the original text, src[Start:End]
	After      string // its replacement; empty deletes it
	Equivalent bool   // an entry of the equivalents file names it: listed, neither run nor counted
	Name       string // a hand-written fault's name (OpFault); "" for generated ones
}

// Apply returns a copy of src, the file's original source, with the mutant
// planted.
func (m Mutant) Apply(src []byte) []byte {
	out := make([]byte, 0, len(src)-(m.End-m.Start)+len(m.After))
	out = append(out, src[:m.Start]...)
	out = append(out, m.After...)
	return append(out, src[m.End:]...)
}

// Pos is where the mutant is, as file:line:col.
func (m Mutant) Pos() string { return fmt.Sprintf("%s:%d:%d", m.File, m.Line, m.Col) }

// Change describes the mutant as "before → after" on one short line.
func (m Mutant) Change() string {
	c := brief(m.Before) + " → " + brief(m.After)
	if m.Name != "" {
		c = m.Name + ": " + c
	}
	return c
}

// brief squeezes a piece of source onto one line of at most 60 characters:
// a removed statement can span lines, and a report line should not.
func brief(s string) string {
	if s == "" {
		return "(removed)"
	}
	s = strings.Join(strings.Fields(s), " ")
	const limit = 60
	if utf8.RuneCountInString(s) > limit {
		s = string([]rune(s)[:limit-1]) + "…"
	}
	return s
}

// Generate returns the mutants of one file, in source order. name is the
// file's display name (relative to the module root). pkgVars holds the
// package-level variables declared in the package's other files (the
// file's own are added here): an assignment to a bare name is only worth
// removing when it stores to one of those, since removing a store to a
// local mostly yields "declared and not used" or an obviously dead value.
func Generate(name string, src []byte, pkgVars map[string]bool) ([]Mutant, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	g := &generator{
		fset: fset,
		tf:   fset.File(f.Pos()),
		src:  src,
		name: name,
		vars: make(map[string]bool),
	}
	maps.Copy(g.vars, pkgVars)
	maps.Copy(g.vars, topLevelVars(f))
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Body == nil || (d.Recv != nil && formattingMethods[d.Name.Name]) {
				continue
			}
			g.fn = funcName(d)
			g.walk(d.Body, declaredNames(d))
		case *ast.GenDecl:
			// Package-level initializers hold expressions worth mutating
			// too (var tables, computed sizes).
			g.fn = genDeclName(d)
			g.walk(d, declaredNames(d))
		}
	}
	slices.SortStableFunc(g.out, func(a, b Mutant) int { return a.Start - b.Start })
	return g.out, nil
}

// generator collects the mutants of one parsed file.
type generator struct {
	fset *token.FileSet
	tf   *token.File
	src  []byte
	name string
	vars map[string]bool // package-level variable names
	fn   string          // the declaration being walked, as Mutant.Func
	out  []Mutant
}

// funcName names a function declaration as Mutant.Func does: f for a
// function, T.m for a method on a value, (*T).m on a pointer; a generic
// receiver's type parameters are left out.
func funcName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return d.Name.Name
	}
	t := d.Recv.List[0].Type
	star := false
	if s, ok := t.(*ast.StarExpr); ok {
		star, t = true, s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	recv := "?"
	if id, ok := t.(*ast.Ident); ok {
		recv = id.Name
	}
	if star {
		return "(*" + recv + ")." + d.Name.Name
	}
	return recv + "." + d.Name.Name
}

// genDeclName names a package-level declaration as Mutant.Func does: its
// keyword and its first name (var table).
func genDeclName(d *ast.GenDecl) string {
	for _, spec := range d.Specs {
		switch s := spec.(type) {
		case *ast.ValueSpec:
			return d.Tok.String() + " " + s.Names[0].Name
		case *ast.TypeSpec:
			return d.Tok.String() + " " + s.Name.Name
		}
	}
	return d.Tok.String()
}

// add records the mutant that replaces the source between from and to.
func (g *generator) add(op Op, from, to token.Pos, after string) {
	start, end := g.tf.Offset(from), g.tf.Offset(to)
	// Ignore //line directives: reports point at the file on disk.
	p := g.fset.PositionFor(from, false)
	g.out = append(g.out, Mutant{
		File:   g.name,
		Line:   p.Line,
		Col:    p.Column,
		Start:  start,
		End:    end,
		Op:     op,
		Func:   g.fn,
		Before: string(g.src[start:end]),
		After:  after,
	})
}

// text is the source of a node, as written.
func (g *generator) text(n ast.Node) string {
	return string(g.src[g.tf.Offset(n.Pos()):g.tf.Offset(n.End())])
}

// walk adds the mutants of every node under root. locals holds the names
// declared anywhere in the enclosing declaration, which shadow
// package-level variables of the same name.
func (g *generator) walk(root ast.Node, locals map[string]bool) {
	ast.Inspect(root, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BinaryExpr:
			g.binary(n)
		case *ast.AssignStmt:
			g.opAssign(n)
		case *ast.IncDecStmt:
			g.incDec(n)
		case *ast.IfStmt:
			g.ifStmt(n)
		case *ast.Ident:
			g.boolLit(n)
		case *ast.SliceExpr:
			g.intLit(n.Low)
			g.intLit(n.High)
			g.intLit(n.Max)
		case *ast.IndexExpr:
			g.intLit(n.Index)
		// Statements are removed only from statement lists, never from
		// the init or post of an if, for or switch, where an empty
		// statement changes the shape of the loop or does not parse.
		case *ast.BlockStmt:
			g.removals(n.List, locals)
		case *ast.CaseClause:
			g.removals(n.Body, locals)
		case *ast.CommClause:
			g.removals(n.Body, locals)
		}
		return true
	})
}

// comparisonFlips maps each comparison to the mutant that moves its
// boundary (< and <=, > and >=) or inverts it (== and !=).
var comparisonFlips = map[token.Token]token.Token{
	token.LSS: token.LEQ,
	token.LEQ: token.LSS,
	token.GTR: token.GEQ,
	token.GEQ: token.GTR,
	token.EQL: token.NEQ,
	token.NEQ: token.EQL,
}

func (g *generator) binary(e *ast.BinaryExpr) {
	opEnd := e.OpPos + token.Pos(len(e.Op.String()))
	switch e.Op {
	case token.LSS, token.LEQ, token.GTR, token.GEQ, token.EQL, token.NEQ:
		g.add(OpComparison, e.OpPos, opEnd, comparisonFlips[e.Op].String())
		// Literals in comparisons are boundaries: off-by-one territory.
		g.intLit(e.X)
		g.intLit(e.Y)
	case token.LAND:
		g.add(OpLogical, e.OpPos, opEnd, "||")
	case token.LOR:
		g.add(OpLogical, e.OpPos, opEnd, "&&")
	case token.ADD:
		// Without type information a string concatenation is only
		// recognisable by a literal operand; the rest that slip through
		// fail to build and are reported as not built.
		if !stringy(e.X) && !stringy(e.Y) {
			g.add(OpArithmetic, e.OpPos, opEnd, "-")
		}
	case token.SUB:
		g.add(OpArithmetic, e.OpPos, opEnd, "+")
	}
}

// stringy reports whether e is visibly a string: a string literal or a
// concatenation with one.
func stringy(e ast.Expr) bool {
	switch e := ast.Unparen(e).(type) {
	case *ast.BasicLit:
		return e.Kind == token.STRING
	case *ast.BinaryExpr:
		return e.Op == token.ADD && (stringy(e.X) || stringy(e.Y))
	}
	return false
}

func (g *generator) opAssign(s *ast.AssignStmt) {
	var to string
	switch s.Tok {
	case token.ADD_ASSIGN:
		if len(s.Rhs) == 1 && stringy(s.Rhs[0]) {
			return
		}
		to = "-="
	case token.SUB_ASSIGN:
		to = "+="
	default:
		return
	}
	g.add(OpArithmetic, s.TokPos, s.TokPos+2, to)
}

func (g *generator) incDec(s *ast.IncDecStmt) {
	to := "--"
	if s.Tok == token.DEC {
		to = "++"
	}
	g.add(OpArithmetic, s.TokPos, s.TokPos+2, to)
}

func (g *generator) ifStmt(s *ast.IfStmt) {
	if isErrCheck(s) {
		g.add(OpErrReturn, s.Cond.Pos(), s.Cond.End(), "false")
	}
	// Negating x == y or x != y is exactly the comparison mutant already
	// planted on its operator: do not count the same fault twice.
	if c, ok := ast.Unparen(s.Cond).(*ast.BinaryExpr); ok && (c.Op == token.EQL || c.Op == token.NEQ) {
		return
	}
	g.add(OpNegateIf, s.Cond.Pos(), s.Cond.End(), "!("+g.text(s.Cond)+")")
}

// isErrCheck reports whether s is an early error return: if v != nil {
// ... return ..., v } (v possibly wrapped, as in fmt.Errorf("...: %w", v)).
// Replacing its condition with false models forgetting the check.
func isErrCheck(s *ast.IfStmt) bool {
	c, ok := s.Cond.(*ast.BinaryExpr)
	if !ok || c.Op != token.NEQ {
		return false
	}
	var v *ast.Ident
	switch {
	case isNil(c.Y):
		v, _ = c.X.(*ast.Ident)
	case isNil(c.X):
		v, _ = c.Y.(*ast.Ident)
	}
	if v == nil || v.Name == "nil" {
		return false
	}
	found := false
	ast.Inspect(s.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false // its returns are not this function's
		case *ast.ReturnStmt:
			if len(n.Results) > 0 && mentions(n.Results[len(n.Results)-1], v.Name) {
				found = true
			}
		}
		return !found
	})
	return found
}

func isNil(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "nil"
}

// mentions reports whether the identifier name occurs in e.
func mentions(e ast.Expr, name string) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Name == name {
			found = true
		}
		return !found
	})
	return found
}

func (g *generator) boolLit(id *ast.Ident) {
	switch id.Name {
	case "true":
		g.add(OpBool, id.Pos(), id.End(), "false")
	case "false":
		g.add(OpBool, id.Pos(), id.End(), "true")
	}
}

// intLit adds the n → n+1 mutant if e is an integer literal.
func (g *generator) intLit(e ast.Expr) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.INT {
		return
	}
	g.add(OpInt, lit.Pos(), lit.End(), bump(lit.Value))
}

// bump returns the literal one more than lit, in hex if lit was, so that
// the report reads 0x10 → 0x11. A literal too large to parse becomes lit+1.
func bump(lit string) string {
	v, err := strconv.ParseUint(lit, 0, 64)
	if err != nil || v == math.MaxUint64 {
		return lit + "+1"
	}
	if strings.HasPrefix(lit, "0x") || strings.HasPrefix(lit, "0X") {
		return fmt.Sprintf("%#x", v+1)
	}
	return strconv.FormatUint(v+1, 10)
}

// removals adds the statement-removal mutants of one statement list: calls
// made for their effect, and stores to memory that outlives the statement
// (a field, an element, a pointee, a package-level variable).
func (g *generator) removals(list []ast.Stmt, locals map[string]bool) {
	for _, s := range list {
		switch s := s.(type) {
		case *ast.ExprStmt:
			if _, ok := ast.Unparen(s.X).(*ast.CallExpr); ok {
				g.add(OpRemove, s.Pos(), s.End(), "")
			}
		case *ast.AssignStmt:
			if s.Tok == token.DEFINE || !g.allStores(s.Lhs, locals) {
				continue
			}
			// Keep the right side, evaluated and discarded: its calls
			// still happen and the variables it reads stay used, so the
			// mutant removes just the store and still builds.
			blanks := strings.Repeat("_, ", len(s.Lhs)-1) + "_"
			rhs := g.src[g.tf.Offset(s.Rhs[0].Pos()):g.tf.Offset(s.Rhs[len(s.Rhs)-1].End())]
			g.add(OpRemove, s.Pos(), s.End(), blanks+" = "+string(rhs))
		case *ast.IncDecStmt:
			if g.isStore(s.X, locals) {
				g.add(OpRemove, s.Pos(), s.End(), "")
			}
		}
	}
}

// allStores reports whether every left-hand side is a store worth removing
// or the blank identifier, and at least one is a store.
func (g *generator) allStores(lhs []ast.Expr, locals map[string]bool) bool {
	stores := 0
	for _, e := range lhs {
		switch {
		case isBlank(e):
		case g.isStore(e, locals):
			stores++
		default:
			return false
		}
	}
	return stores > 0
}

func isBlank(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "_"
}

// isStore reports whether assigning to e writes memory that outlives the
// statement: a field, an element, a pointee, or a package-level variable
// not shadowed by a local of the same name.
func (g *generator) isStore(e ast.Expr, locals map[string]bool) bool {
	switch e := ast.Unparen(e).(type) {
	case *ast.SelectorExpr, *ast.IndexExpr, *ast.StarExpr:
		return true
	case *ast.Ident:
		return e.Name != "_" && g.vars[e.Name] && !locals[e.Name]
	}
	return false
}

// declaredNames returns every name declared inside root: parameters,
// results, receivers, := and var declarations, range variables. It ignores
// scopes on purpose: a name declared anywhere in a function is taken to
// shadow the package-level variable everywhere in it, which can only skip
// a mutant, never plant one that removes a local store.
func declaredNames(root ast.Node) map[string]bool {
	names := make(map[string]bool)
	add := func(ids ...*ast.Ident) {
		for _, id := range ids {
			names[id.Name] = true
		}
	}
	addExprs := func(es ...ast.Expr) {
		for _, e := range es {
			if id, ok := e.(*ast.Ident); ok {
				add(id)
			}
		}
	}
	ast.Inspect(root, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.Field:
			add(n.Names...)
		case *ast.ValueSpec:
			add(n.Names...)
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE {
				addExprs(n.Lhs...)
			}
		case *ast.RangeStmt:
			if n.Tok == token.DEFINE {
				addExprs(n.Key, n.Value)
			}
		}
		return true
	})
	return names
}

// topLevelVars returns the package-level variable names a file declares.
func topLevelVars(f *ast.File) map[string]bool {
	names := make(map[string]bool)
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.VAR {
			continue
		}
		for _, spec := range gd.Specs {
			for _, id := range spec.(*ast.ValueSpec).Names {
				names[id.Name] = true
			}
		}
	}
	return names
}

// packageVars returns the package-level variables declared by the other
// non-test files of package pkg in dir. It is a best-effort guide for
// statement removal: a file that does not parse is skipped (the baseline
// run reports it), and build constraints are ignored (a name declared
// under another tag only makes a mutant that may not build).
func packageVars(dir, pkg, except string) (map[string]bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	vars := make(map[string]bool)
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(dir, name)
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || path == except {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil || f.Name.Name != pkg {
			continue
		}
		maps.Copy(vars, topLevelVars(f))
	}
	return vars, nil
}

// packageName returns the package clause of a Go source file.
func packageName(name string, src []byte) (string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.PackageClauseOnly)
	if err != nil {
		return "", err
	}
	return f.Name.Name, nil
}
