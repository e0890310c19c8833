package firmware_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// snakeCase is a JSON key's form: lower-case words joined by underscores.
var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// tagProblem says what is wrong with tag as the JSON name of the field
// called field, or returns "". The name is the field's name in snake case:
// its letters and digits, lower case, in order, split into words at will
// (the device's C names split MaxSGERD as max_sge_rd), but no word is a
// single letter: a generic camel-case conversion spells the initialisms
// of VendorPartID and ActiveMTU vendor_part_i_d and active_m_t_u.
func tagProblem(field, tag string) string {
	switch {
	case tag == "":
		return "no json tag"
	case !snakeCase.MatchString(tag):
		return fmt.Sprintf("json %q is not snake_case", tag)
	case strings.ReplaceAll(tag, "_", "") != strings.ToLower(field):
		return fmt.Sprintf("json %q is not %s in snake case", tag, field)
	}
	for w := range strings.SplitSeq(tag, "_") {
		if len(w) == 1 && w[0] >= 'a' && w[0] <= 'z' {
			return fmt.Sprintf("json %q splits an initialism letter by letter (%q is one letter)", tag, w)
		}
	}
	return ""
}

// jsonStructs parses the package's non-test files and returns, for every
// struct type that has a field with a json tag, each exported field's
// name and json name ("" for none), as type.field → name.
func jsonStructs(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	out := map[string]string{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			fields := map[string]string{}
			tagged := false
			for _, fl := range st.Fields.List {
				json := ""
				if fl.Tag != nil {
					tag, err := strconv.Unquote(fl.Tag.Value)
					require.NoError(t, err)
					if v, ok := reflect.StructTag(tag).Lookup("json"); ok {
						tagged = true
						json, _, _ = strings.Cut(v, ",")
					}
				}
				for _, id := range fl.Names {
					if id.IsExported() {
						fields[ts.Name.Name+"."+id.Name] = json
					}
				}
			}
			if tagged {
				for k, v := range fields {
					out[k] = v
				}
			}
			return true
		})
	}
	return out
}

// Every exported field of a JSON-tagged struct of the package (Caps,
// PortAttr, Quirks) has a json tag, and the tag is the field's name in
// snake case, its initialisms whole: vendor_part_id, active_mtu,
// max_map_per_fmr.
func TestEveryJSONTagIsItsFieldsNameInSnakeCase(t *testing.T) {
	fields := jsonStructs(t)
	for _, f := range []string{"Caps.VendorPartID", "Caps.MaxMapPerFMR", "PortAttr.ActiveMTU", "Quirks.SRQSwap"} {
		require.Contains(t, fields, f, "the JSON-tagged structs are found")
	}
	for field, tag := range fields {
		_, name, _ := strings.Cut(field, ".")
		assert.Empty(t, tagProblem(name, tag), field)
	}
}

// The check refuses what it is for: a missing tag, a tag not in snake case
// or not the field's name, an initialism split letter by letter; and takes
// the device's own word breaks.
func TestJSONTagCheckRefusesSplitInitialismsAndOtherNames(t *testing.T) {
	for field, tag := range map[string]string{
		"VendorPartID":    "vendor_part_id",
		"ActiveMTU":       "active_mtu",
		"MaxMapPerFMR":    "max_map_per_fmr",
		"MaxSGERD":        "max_sge_rd",
		"MaxRawIPv6QP":    "max_raw_ipv6_qp",
		"DeviceCapFlags2": "device_cap_flags2",
	} {
		assert.Empty(t, tagProblem(field, tag), "%s %s", field, tag)
	}
	for _, c := range []struct{ field, tag string }{
		{"VendorPartID", "vendor_part_i_d"},
		{"ActiveMTU", "active_m_t_u"},
		{"MaxMapPerFMR", "max_map_per_f_m_r"},
		{"ActiveMTU", ""},
		{"ActiveMTU", "ActiveMTU"},
		{"ActiveMTU", "active-mtu"},
		{"MaxQP", "max_qps"},
		{"MaxQP", "qp_max"},
	} {
		assert.NotEmpty(t, tagProblem(c.field, c.tag), "%s %q", c.field, c.tag)
	}
}
