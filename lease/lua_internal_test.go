package lease

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/yuin/gopher-lua/ast"
	"github.com/yuin/gopher-lua/parse"

	"github.com/distkit-go/distlock/internal/redistest"
)

// The scripts are assembled from pieces (scripts.go), each relying on
// locals that its includer declares. A piece included where a local it
// needs is not declared reads a global instead, which Redis refuses only
// when that line runs: perhaps on a contended path that no test reached,
// at a user's first such call. These tests check every script as it is
// sent: Redis compiles it, and no name in it is a global that Redis does
// not define.

// luaGlobals are the globals a script of Redis may read (Redis 6.2 to 8,
// Valkey).
var luaGlobals = map[string]bool{
	"KEYS": true, "ARGV": true, "redis": true,
	"string": true, "math": true, "table": true, "bit": true, "cjson": true,
	"cmsgpack": true, "struct": true, "os": true,
	"tonumber": true, "tostring": true, "type": true, "pairs": true,
	"ipairs": true, "next": true, "select": true, "unpack": true,
	"error": true, "pcall": true, "assert": true, "rawget": true,
	"rawset": true, "rawequal": true, "setmetatable": true,
	"getmetatable": true,
}

// TestScriptsUseNoUndeclaredName parses every script and reports each
// name it reads or writes that is neither a local in scope nor a global of
// Redis.
func TestScriptsUseNoUndeclaredName(t *testing.T) {
	if len(allScripts) < 10 {
		t.Fatalf("allScripts has %d scripts; want every script of the package", len(allScripts))
	}
	for i, s := range allScripts {
		chunk, err := parse.Parse(strings.NewReader(s.src), fmt.Sprintf("script%d", i))
		if err != nil {
			t.Errorf("script %d (%s): does not parse: %v\n%s", i, s.sha, err, s.src)
			continue
		}
		free := freeNames(chunk)
		if len(free) > 0 {
			t.Errorf("script %d (%s, starting %q): names neither declared nor Redis globals: %v",
				i, s.sha, firstLine(s.src), free)
		}
	}
}

// TestFreeNamesFindsAMissingLocal: the check above can fail. A piece that
// reads a local its includer did not declare is found, and so is a write
// to an undeclared name; locals of an enclosing block, parameters, loop
// variables and a local function's own name are not.
func TestFreeNamesFindsAMissingLocal(t *testing.T) {
	cases := []struct {
		src  string
		want []string
	}{
		{"local a = 1\nreturn a + b", []string{"b"}},
		{"x = 1", []string{"x"}},
		{"local function f(n) if n > 0 then return f(n - 1) end return KEYS[1] end return f(2)", nil},
		{"for i, v in ipairs(ARGV) do local w = v end return w", []string{"w"}},
		{"for i = 1, 3 do end return i", []string{"i"}},
		{"local t = {a = 1}\nreturn t.a + string.len(t.b)", nil},
		{"repeat local r = 1 until r == 1", nil},
		{"do local d = 1 end return d", []string{"d"}},
		{"local x = x", []string{"x"}},
	}
	for _, c := range cases {
		chunk, err := parse.Parse(strings.NewReader(c.src), "case")
		if err != nil {
			t.Fatalf("%q: %v", c.src, err)
		}
		got := freeNames(chunk)
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("freeNames(%q) = %v; want %v", c.src, got, c.want)
		}
	}
}

// TestScriptsLoad has a real server compile every script as it is sent.
func TestScriptsLoad(t *testing.T) {
	srv := redistest.Start(t)
	for i, s := range allScripts {
		sha, err := srv.MustDo("SCRIPT", "LOAD", s.src).ToString()
		if err != nil || sha != s.sha {
			t.Errorf("script %d: SCRIPT LOAD = %q, %v; want %s", i, sha, err, s.sha)
		}
	}
}

func firstLine(src string) string {
	src = strings.TrimSpace(src)
	if i := strings.IndexByte(src, '\n'); i >= 0 {
		return src[:i]
	}
	return src
}

// freeNames returns, sorted, the names that chunk reads or assigns which
// are neither locals in scope there nor luaGlobals.
func freeNames(chunk []ast.Stmt) []string {
	w := &nameWalker{free: map[string]bool{}}
	w.block(chunk, nil)
	out := make([]string, 0, len(w.free))
	for n := range w.free {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// nameWalker walks a chunk with the locals in scope, innermost last.
type nameWalker struct {
	scope []string
	free  map[string]bool
}

func (w *nameWalker) declare(names ...string) { w.scope = append(w.scope, names...) }

func (w *nameWalker) use(name string) {
	for i := len(w.scope) - 1; i >= 0; i-- {
		if w.scope[i] == name {
			return
		}
	}
	if !luaGlobals[name] {
		w.free[name] = true
	}
}

// block walks stmts in a new scope holding names first; then, if
// after is not nil, the expression after (a repeat's condition, which
// sees the body's locals).
func (w *nameWalker) block(stmts []ast.Stmt, after ast.Expr, names ...string) {
	mark := len(w.scope)
	w.declare(names...)
	for _, s := range stmts {
		w.stmt(s)
	}
	if after != nil {
		w.expr(after)
	}
	w.scope = w.scope[:mark]
}

func (w *nameWalker) stmt(s ast.Stmt) {
	switch s := s.(type) {
	case *ast.LocalAssignStmt:
		// "local function f" is parsed as "local f = function": f is in
		// scope in its own body. A local assigned any other expression is
		// in scope only after it.
		if len(s.Names) == 1 && len(s.Exprs) == 1 {
			if _, ok := s.Exprs[0].(*ast.FunctionExpr); ok {
				w.declare(s.Names...)
				w.expr(s.Exprs[0])
				return
			}
		}
		w.exprs(s.Exprs)
		w.declare(s.Names...)
	case *ast.AssignStmt:
		w.exprs(s.Rhs)
		w.exprs(s.Lhs)
	case *ast.FuncCallStmt:
		w.expr(s.Expr)
	case *ast.DoBlockStmt:
		w.block(s.Stmts, nil)
	case *ast.WhileStmt:
		w.expr(s.Condition)
		w.block(s.Stmts, nil)
	case *ast.RepeatStmt:
		w.block(s.Stmts, s.Condition)
	case *ast.IfStmt:
		w.expr(s.Condition)
		w.block(s.Then, nil)
		w.block(s.Else, nil)
	case *ast.NumberForStmt:
		w.expr(s.Init)
		w.expr(s.Limit)
		if s.Step != nil {
			w.expr(s.Step)
		}
		w.block(s.Stmts, nil, s.Name)
	case *ast.GenericForStmt:
		w.exprs(s.Exprs)
		w.block(s.Stmts, nil, s.Names...)
	case *ast.FuncDefStmt:
		if s.Name.Func != nil {
			w.expr(s.Name.Func)
		}
		if s.Name.Receiver != nil {
			w.expr(s.Name.Receiver)
		}
		w.expr(s.Func)
	case *ast.ReturnStmt:
		w.exprs(s.Exprs)
	case *ast.BreakStmt, *ast.LabelStmt, *ast.GotoStmt:
	default:
		panic(fmt.Sprintf("nameWalker: statement %T", s))
	}
}

func (w *nameWalker) exprs(es []ast.Expr) {
	for _, e := range es {
		w.expr(e)
	}
}

func (w *nameWalker) expr(e ast.Expr) {
	switch e := e.(type) {
	case *ast.IdentExpr:
		w.use(e.Value)
	case *ast.AttrGetExpr:
		w.expr(e.Object)
		w.expr(e.Key)
	case *ast.TableExpr:
		for _, f := range e.Fields {
			if f.Key != nil {
				w.expr(f.Key)
			}
			w.expr(f.Value)
		}
	case *ast.FuncCallExpr:
		if e.Func != nil {
			w.expr(e.Func)
		}
		if e.Receiver != nil {
			w.expr(e.Receiver)
		}
		w.exprs(e.Args)
	case *ast.LogicalOpExpr:
		w.expr(e.Lhs)
		w.expr(e.Rhs)
	case *ast.RelationalOpExpr:
		w.expr(e.Lhs)
		w.expr(e.Rhs)
	case *ast.StringConcatOpExpr:
		w.expr(e.Lhs)
		w.expr(e.Rhs)
	case *ast.ArithmeticOpExpr:
		w.expr(e.Lhs)
		w.expr(e.Rhs)
	case *ast.UnaryMinusOpExpr:
		w.expr(e.Expr)
	case *ast.UnaryNotOpExpr:
		w.expr(e.Expr)
	case *ast.UnaryLenOpExpr:
		w.expr(e.Expr)
	case *ast.FunctionExpr:
		w.block(e.Stmts, nil, e.ParList.Names...)
	case *ast.TrueExpr, *ast.FalseExpr, *ast.NilExpr, *ast.NumberExpr, *ast.StringExpr, *ast.Comma3Expr:
	default:
		panic(fmt.Sprintf("nameWalker: expression %T", e))
	}
}
