package lease

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	lua "github.com/yuin/gopher-lua/ast"
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

// luaPieces are the pieces that scripts.go assembles its scripts from,
// by name, as they are included: a piece made by a function with a reply
// expression is given the reply "nil".
var luaPieces = map[string]string{
	"seenLua": seenLua, "leanAnnounceLua": leanAnnounceLua, "cancelLua": cancelLua,
	"leanPadLua": leanPadLua, "leanClockLua": leanClockLua, "leanNextTokenLua": leanNextTokenLua,
	"leanTokenLua": leanTokenLua, "leanSetTokenLua": leanSetTokenLua, "leanUnsetTokenLua": leanUnsetTokenLua, "leanPlaceLua": leanPlaceLua, "leanHeadLua": leanHeadLua,
	"leanWakeLua": leanWakeLua, "leanQueueLua": leanQueueLua, "leanPassLua": leanPassLua,
	"leanSemQueueLua": leanSemQueueLua, "leanSemPassLua": leanSemPassLua,
	"leanRWQueueLua": leanRWQueueLua, "leanRWPassLua": leanRWPassLua,
	"voidLua": voidLua("nil"), "staleLua": staleLua("nil"), "leaseKindLua": leaseKindLua,
	"lockLua": lockLua, "semLua": semLua, "protocolLua": protocolLua, "grantLua": grantLua,
	"semPassLua": semPassLua, "lineLua": lineLua, "serveLua": serveLua,
	"lockAcquireLua": lockAcquireLua, "lockReleaseLua": lockReleaseLua,
	"renewStringLua": renewStringLua, "renewHashLua": renewHashLua,
}

// TestLuaPiecesStateTheirContracts: every piece of Lua in the package
// (a package-level value or function whose name ends in "Lua") opens with
// its contract, "--[[ name: needs a b; defines x y ]]", and the contract
// is exact: the piece reads or sets the includer's locals it needs and no
// other name (Redis's globals aside), and declares, at its top level, the
// locals it defines and no others (they stay in scope after it). Whether
// each includer declares what its pieces need is
// TestScriptsUseNoUndeclaredName's check, on the scripts as sent.
func TestLuaPiecesStateTheirContracts(t *testing.T) {
	for _, name := range goLuaNames(t) {
		if _, ok := luaPieces[name]; !ok {
			t.Errorf("%s is not in luaPieces: add it, so that its contract is checked", name)
		}
	}
	for name, src := range luaPieces {
		if err := checkContract(name, src); err != nil {
			t.Error(err)
		}
	}
}

// TestCheckContractFindsAWrongOne: the check above can fail.
func TestCheckContractFindsAWrongOne(t *testing.T) {
	for _, src := range []string{
		"local a = b", // no header
		"--[[ other: needs b; defines a ]]\nlocal a = b",   // another's header
		"--[[ p: needs nothing; defines a ]]\nlocal a = b", // b not stated
		"--[[ p: needs b c; defines a ]]\nlocal a = b",     // c not read
		"--[[ p: needs b ]]\nlocal a = b",                  // a not stated
		"--[[ p: needs b; defines a z ]]\nlocal a = b",     // z not defined
	} {
		if err := checkContract("p", src); err == nil {
			t.Errorf("checkContract(%q) = nil; want an error", src)
		}
	}
	if err := checkContract("p", "--[[ p: needs b; defines a ]]\nlocal a = b\nif a then local c = 1 end"); err != nil {
		t.Errorf("a right contract: %v", err)
	}
}

var contractHeader = regexp.MustCompile(`^\s*--\[\[ (\w+): needs ([\w ]+?)(?:; defines ([\w ]+))? \]\]`)

// checkContract checks that src opens with the contract of the piece name
// and keeps to it.
func checkContract(name, src string) error {
	m := contractHeader.FindStringSubmatch(src)
	if m == nil || m[1] != name {
		return fmt.Errorf("%s does not open with its contract (--[[ %s: needs ...; defines ... ]]): %q", name, name, firstLine(src))
	}
	needs := strings.Fields(m[2])
	if m[2] == "nothing" {
		needs = nil
	}
	defines := strings.Fields(m[3])
	// A piece that is an expression (it opens with "(") is checked as
	// the value of a return.
	text := src[len(m[0]):]
	if strings.HasPrefix(text, "(") {
		text = "return " + text
	}
	chunk, err := parse.Parse(strings.NewReader("local function piece()\n"+text+"\nend"), name)
	if err != nil {
		return fmt.Errorf("%s does not parse: %v", name, err)
	}
	body := chunk[0].(*lua.LocalAssignStmt).Exprs[0].(*lua.FunctionExpr).Stmts
	var declared []string
	for _, s := range body {
		if l, ok := s.(*lua.LocalAssignStmt); ok {
			declared = append(declared, l.Names...)
		}
	}
	got, want := freeNames(body), slices.Sorted(slices.Values(needs))
	if !slices.Equal(got, want) {
		return fmt.Errorf("%s needs %v, its contract says %v", name, got, want)
	}
	slices.Sort(declared)
	declared = slices.Compact(declared)
	if want := slices.Compact(slices.Sorted(slices.Values(defines))); !slices.Equal(declared, want) {
		return fmt.Errorf("%s defines %v, its contract says %v", name, declared, want)
	}
	return nil
}

// goLuaNames returns the names of the package-level values and functions
// of the package's Go files (tests aside) that end in "Lua".
func goLuaNames(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					names = append(names, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if v, ok := s.(*ast.ValueSpec); ok {
						for _, n := range v.Names {
							names = append(names, n.Name)
						}
					}
				}
			}
		}
	}
	return slices.DeleteFunc(names, func(n string) bool { return !strings.HasSuffix(n, "Lua") })
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
func freeNames(chunk []lua.Stmt) []string {
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
func (w *nameWalker) block(stmts []lua.Stmt, after lua.Expr, names ...string) {
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

func (w *nameWalker) stmt(s lua.Stmt) {
	switch s := s.(type) {
	case *lua.LocalAssignStmt:
		// "local function f" is parsed as "local f = function": f is in
		// scope in its own body. A local assigned any other expression is
		// in scope only after it.
		if len(s.Names) == 1 && len(s.Exprs) == 1 {
			if _, ok := s.Exprs[0].(*lua.FunctionExpr); ok {
				w.declare(s.Names...)
				w.expr(s.Exprs[0])
				return
			}
		}
		w.exprs(s.Exprs)
		w.declare(s.Names...)
	case *lua.AssignStmt:
		w.exprs(s.Rhs)
		w.exprs(s.Lhs)
	case *lua.FuncCallStmt:
		w.expr(s.Expr)
	case *lua.DoBlockStmt:
		w.block(s.Stmts, nil)
	case *lua.WhileStmt:
		w.expr(s.Condition)
		w.block(s.Stmts, nil)
	case *lua.RepeatStmt:
		w.block(s.Stmts, s.Condition)
	case *lua.IfStmt:
		w.expr(s.Condition)
		w.block(s.Then, nil)
		w.block(s.Else, nil)
	case *lua.NumberForStmt:
		w.expr(s.Init)
		w.expr(s.Limit)
		if s.Step != nil {
			w.expr(s.Step)
		}
		w.block(s.Stmts, nil, s.Name)
	case *lua.GenericForStmt:
		w.exprs(s.Exprs)
		w.block(s.Stmts, nil, s.Names...)
	case *lua.FuncDefStmt:
		if s.Name.Func != nil {
			w.expr(s.Name.Func)
		}
		if s.Name.Receiver != nil {
			w.expr(s.Name.Receiver)
		}
		w.expr(s.Func)
	case *lua.ReturnStmt:
		w.exprs(s.Exprs)
	case *lua.BreakStmt, *lua.LabelStmt, *lua.GotoStmt:
	default:
		panic(fmt.Sprintf("nameWalker: statement %T", s))
	}
}

func (w *nameWalker) exprs(es []lua.Expr) {
	for _, e := range es {
		w.expr(e)
	}
}

func (w *nameWalker) expr(e lua.Expr) {
	switch e := e.(type) {
	case *lua.IdentExpr:
		w.use(e.Value)
	case *lua.AttrGetExpr:
		w.expr(e.Object)
		w.expr(e.Key)
	case *lua.TableExpr:
		for _, f := range e.Fields {
			if f.Key != nil {
				w.expr(f.Key)
			}
			w.expr(f.Value)
		}
	case *lua.FuncCallExpr:
		if e.Func != nil {
			w.expr(e.Func)
		}
		if e.Receiver != nil {
			w.expr(e.Receiver)
		}
		w.exprs(e.Args)
	case *lua.LogicalOpExpr:
		w.expr(e.Lhs)
		w.expr(e.Rhs)
	case *lua.RelationalOpExpr:
		w.expr(e.Lhs)
		w.expr(e.Rhs)
	case *lua.StringConcatOpExpr:
		w.expr(e.Lhs)
		w.expr(e.Rhs)
	case *lua.ArithmeticOpExpr:
		w.expr(e.Lhs)
		w.expr(e.Rhs)
	case *lua.UnaryMinusOpExpr:
		w.expr(e.Expr)
	case *lua.UnaryNotOpExpr:
		w.expr(e.Expr)
	case *lua.UnaryLenOpExpr:
		w.expr(e.Expr)
	case *lua.FunctionExpr:
		w.block(e.Stmts, nil, e.ParList.Names...)
	case *lua.TrueExpr, *lua.FalseExpr, *lua.NilExpr, *lua.NumberExpr, *lua.StringExpr, *lua.Comma3Expr:
	default:
		panic(fmt.Sprintf("nameWalker: expression %T", e))
	}
}
