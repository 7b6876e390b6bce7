package distlock_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// sectionRef finds the ways doc comments point at a section of the package
// documentation: `the section "Waiting"`, `the Topologies section of the
// package documentation`, `the package documentation, "Waiting"`.
var sectionRef = regexp.MustCompile(`section "([^"]+)"|the ([A-Z][\w ]*?) section of the package documentation|package documentation, "([^"]+)"`)

func TestDocSectionReferencesExist(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	headings := map[string]bool{}
	type ref struct{ where, name string }
	var refs []ref
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		require.NoError(t, err)
		for _, cg := range f.Comments {
			text := cg.Text()
			for line := range strings.SplitSeq(text, "\n") {
				if h, ok := strings.CutPrefix(line, "# "); ok && name == "doc.go" {
					headings[h] = true
				}
			}
			// Comments wrap lines; a reference may span two.
			flat := strings.Join(strings.Fields(text), " ")
			for _, m := range sectionRef.FindAllStringSubmatch(flat, -1) {
				refs = append(refs, ref{fset.Position(cg.Pos()).String(), m[1] + m[2] + m[3]})
			}
		}
	}
	require.NotEmpty(t, headings, "no headings found in doc.go")
	require.NotEmpty(t, refs, "no section references found: has the wording changed?")
	for _, r := range refs {
		assert.True(t, headings[r.name], "%s refers to the section %q, which doc.go does not have", r.where, r.name)
	}
}

// docs/keys.md, the page of the keys a name uses, must say how long the
// fencing key lives, which lease.FenceRetention decides.
func TestKeysPageSaysHowLongTheFenceKeyLives(t *testing.T) {
	page, err := os.ReadFile(filepath.Join("docs", "keys.md"))
	require.NoError(t, err)
	flat := strings.Join(strings.Fields(string(page)), " ")
	assert.Contains(t, flat, ":fence")
	assert.Contains(t, flat, fmt.Sprintf("%.0f hours", lease.FenceRetention.Hours()),
		"docs/keys.md should say how long the fencing key is kept")
}

// SAFETY.md maps each clause of the contract to the tests that check it;
// every test it names, in its tables or its text, must be a test function
// of the repository, so that it cannot name a test that was renamed or
// removed. A test of the client-independent suite is named as it runs,
// TestSuite<Group>/<Subtest>: the top-level test must exist, and the
// group's function in internal/suite must run a subtest of that name.
func TestSafetyTableNamesRealTests(t *testing.T) {
	doc, err := os.ReadFile("SAFETY.md")
	require.NoError(t, err)
	text := string(doc)
	require.Contains(t, text, "## Which tests check which clause")
	names := regexp.MustCompile("`(Test\\w+(?:/\\w+)?)`").FindAllStringSubmatch(text, -1)
	require.NotEmpty(t, names)

	defined := map[string]bool{}
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range regexp.MustCompile(`(?m)^func (Test\w+)\(`).FindAllStringSubmatch(string(src), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	require.NoError(t, err)
	subtests := suiteSubtests(t)
	require.NotEmpty(t, subtests, "no subtests found in internal/suite: has its shape changed?")
	for _, m := range names {
		top, sub, isSuite := strings.Cut(m[1], "/")
		if !assert.True(t, defined[top], "SAFETY.md names %s, which is no test of the repository", top) || !isSuite {
			continue
		}
		group, ok := strings.CutPrefix(top, "TestSuite")
		if assert.True(t, ok, "SAFETY.md names the subtest %s of %s, which is not a suite test", sub, top) {
			assert.True(t, subtests[group][sub], "SAFETY.md names %s, but suite.%s runs no subtest %s", m[1], group, sub)
		}
	}
}

// suiteSubtests returns, for each exported function of internal/suite
// (a group), the names of the subtests it runs: the string literals it
// passes to a Run method.
func suiteSubtests(t *testing.T) map[string]map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("internal", "suite", "*.go"))
	require.NoError(t, err)
	groups := map[string]map[string]bool{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !fn.Name.IsExported() || fn.Body == nil {
				continue
			}
			runs := map[string]bool{}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) == 0 {
					return true
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Run" {
					if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						if s, err := strconv.Unquote(lit.Value); err == nil {
							runs[s] = true
						}
					}
				}
				return true
			})
			groups[fn.Name.Name] = runs
		}
	}
	return groups
}
