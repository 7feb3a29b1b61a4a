// Package grafana holds no code: its tests check the Grafana dashboard
// beside them, leasehold.json. It must import into any Grafana (the data
// source is a variable, and no uid of one installation is written in
// it), its panels must lay out on the grid without overlapping, and every
// query, once Grafana's variables are replaced, must be PromQL that
// promtool accepts. That the queries read only series the programs
// export, with labels those series carry, is checked where a coordinator
// cluster and a renderer run: TestDashboardReadsExportedSeries in package
// coordinator.
//
// promtool comes from Debian's prometheus package (scripts/check-rules
// installs it). Without it the promtool check skips and says so, unless
// LEASEHOLD_REQUIRE_PROMTOOL is set, as scripts/check-rules sets it.
package grafana

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// dashboardFile is the dashboard under test.
const dashboardFile = "leasehold.json"

// The dashboard as far as these tests read it.
type (
	dashboard struct {
		Templating struct {
			List []variable `json:"list"`
		} `json:"templating"`
		Panels []panel `json:"panels"`
	}
	variable struct {
		Name       string      `json:"name"`
		Type       string      `json:"type"`
		Query      string      `json:"query"`
		Datasource *datasource `json:"datasource"`
	}
	panel struct {
		ID          int         `json:"id"`
		Type        string      `json:"type"`
		Title       string      `json:"title"`
		Description string      `json:"description"`
		Datasource  *datasource `json:"datasource"`
		GridPos     gridPos     `json:"gridPos"`
		Targets     []target    `json:"targets"`
		// Panels are a collapsed row's.
		Panels []panel `json:"panels"`
	}
	gridPos struct {
		H, W, X, Y int
	}
	target struct {
		RefID      string      `json:"refId"`
		Expr       string      `json:"expr"`
		Datasource *datasource `json:"datasource"`
	}
	datasource struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
)

// datasourceRef is how every panel, query and variable names its data
// source: the dashboard's datasource variable, which the importer picks.
var datasourceRef = datasource{Type: "prometheus", UID: "${datasource}"}

// gridColumns is the width of Grafana's grid.
const gridColumns = 24

// load returns the dashboard, decoded, and as generic JSON.
func load(t *testing.T) (dashboard, any) {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var raw any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d, raw
}

// allPanels returns the dashboard's panels, rows' and collapsed rows'
// alike, in order.
func allPanels(d dashboard) []panel {
	var out []panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// TestDashboardImports checks what an import into another Grafana needs:
// a datasource variable that every panel, query and variable uses, no
// uid or id of the Grafana it was made in, and a layout that fits.
func TestDashboardImports(t *testing.T) {
	t.Parallel()
	d, raw := load(t)

	t.Run("The data source is a variable, and every reference uses it", func(t *testing.T) {
		var found bool
		for _, v := range d.Templating.List {
			if v.Name == "datasource" {
				found = v.Type == "datasource" && v.Query == "prometheus"
			}
		}
		if !found {
			t.Fatal(`want a templating variable "datasource" of type datasource, query prometheus`)
		}
		walk(raw, "", func(path string, key string, v any) {
			switch key {
			case "uid":
				if v != datasourceRef.UID {
					t.Errorf("%s = %v: the only uid a dashboard that others import may name is %s", path, v, datasourceRef.UID)
				}
			case "datasource":
				if !isDatasourceRef(v) {
					t.Errorf("%s = %v, want %v", path, v, datasourceRef)
				}
			case "id":
				if path == ".id" && v != nil {
					t.Errorf("the dashboard's id is %v: an id belongs to the Grafana that stores it; want null", v)
				}
			case "__inputs", "__requires":
				t.Errorf("%s: a dashboard exported for sharing; this one takes its data source from the variable", path)
			}
		})
		for _, v := range d.Templating.List {
			if v.Type == "query" && (v.Datasource == nil || *v.Datasource != datasourceRef) {
				t.Errorf("variable %s: datasource %v, want %v", v.Name, v.Datasource, datasourceRef)
			}
		}
	})

	t.Run("Every panel has an id of its own, a title, a description and queries", func(t *testing.T) {
		ids := map[int]string{}
		for _, p := range allPanels(d) {
			if p.ID <= 0 || ids[p.ID] != "" {
				t.Errorf("panel %q: id %d is not positive or is %q's too", p.Title, p.ID, ids[p.ID])
			}
			ids[p.ID] = p.Title
			if p.Type == "row" {
				continue
			}
			if p.Title == "" || p.Description == "" {
				t.Errorf("panel %d: want a title and a description (what it shows, which alert and runbook it belongs to)", p.ID)
			}
			if p.Datasource == nil || *p.Datasource != datasourceRef {
				t.Errorf("panel %q: datasource %v, want %v", p.Title, p.Datasource, datasourceRef)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			refs := map[string]bool{}
			for _, q := range p.Targets {
				if q.RefID == "" || refs[q.RefID] || strings.TrimSpace(q.Expr) == "" {
					t.Errorf("panel %q: query %q has an empty or repeated refId, or no expression", p.Title, q.RefID)
				}
				refs[q.RefID] = true
			}
		}
	})

	t.Run("Panels lie on the grid without overlapping", func(t *testing.T) {
		ps := allPanels(d)
		for i, p := range ps {
			g := p.GridPos
			if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > gridColumns {
				t.Errorf("panel %q: gridPos %+v leaves the %d columns", p.Title, g, gridColumns)
			}
			if p.Type == "row" && (g.W != gridColumns || g.X != 0) {
				t.Errorf("row %q: gridPos %+v, want the full width", p.Title, g)
			}
			for _, o := range ps[:i] {
				h := o.GridPos
				if g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
					t.Errorf("panels %q %+v and %q %+v overlap", o.Title, h, p.Title, g)
				}
			}
		}
	})
}

// walk calls fn for every key of every object in v, with its path.
func walk(v any, path string, fn func(path, key string, v any)) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			fn(path+"."+k, k, e)
			walk(e, path+"."+k, fn)
		}
	case []any:
		for i, e := range v {
			walk(e, fmt.Sprintf("%s[%d]", path, i), fn)
		}
	}
}

// isDatasourceRef reports whether v, a decoded JSON value, is
// datasourceRef and nothing else.
func isDatasourceRef(v any) bool {
	m, ok := v.(map[string]any)
	return ok && len(m) == 2 && m["type"] == datasourceRef.Type && m["uid"] == datasourceRef.UID
}

// query is one PromQL expression of the dashboard: a panel's target, or
// the selector of a variable's label_values.
type query struct {
	// where names it: the panel's title and the target's refId, or the
	// variable.
	where string
	expr  string
}

// queries returns every PromQL expression the dashboard evaluates, as
// written (Grafana's variables unreplaced).
func queries(t *testing.T, d dashboard) []query {
	t.Helper()
	var out []query
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Query)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(<selector>, <label>)", v.Name, v.Query)
			continue
		}
		out = append(out, query{where: "variable " + v.Name, expr: m[1]})
	}
	for _, p := range allPanels(d) {
		for _, q := range p.Targets {
			out = append(out, query{where: fmt.Sprintf("panel %d %q, query %s", p.ID, p.Title, q.RefID), expr: q.Expr})
		}
	}
	return out
}

// labelValues is the one query a variable may make: Grafana's
// label_values(<selector>, <label>).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)

// variableValues are what the PromQL check puts for Grafana's variables:
// a value of the right kind for each. $team is a multi-value variable, so
// it is only ever matched with =~ (see expand).
var variableValues = map[string]string{
	"$__rate_interval": "5m",
	"$__interval":      "1m",
	"$__range":         "1h",
	"$team":            ".*",
}

// variableRef finds a Grafana variable in an expression.
var variableRef = regexp.MustCompile(`\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?`)

// expand replaces Grafana's variables in expr with variableValues. It
// refuses a variable it does not know, and $team other than in team=~,
// where a value of several teams ("a|b") would not match.
func expand(expr string) (string, error) {
	if n, ok := strings.Count(expr, "$team"), strings.Count(expr, `team=~"$team"`); n != ok {
		return "", fmt.Errorf(`$team appears other than as team=~"$team"`)
	}
	var unknown []string
	out := variableRef.ReplaceAllStringFunc(expr, func(ref string) string {
		v, ok := variableValues[ref]
		if !ok {
			unknown = append(unknown, ref)
		}
		return v
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("unknown variables %v (known: %v)", unknown, keys(variableValues))
	}
	return out, nil
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// rulesFile is a Prometheus rules file that records each query, for
// promtool to parse. JSON is YAML, so encoding/json writes it.
type rulesFile struct {
	Groups []rulesGroup `json:"groups"`
}

type rulesGroup struct {
	Name  string       `json:"name"`
	Rules []recordRule `json:"rules"`
}

type recordRule struct {
	Record string `json:"record"`
	Expr   string `json:"expr"`
}

// promtoolCheck writes qs as recording rules, dashboard:query_<i>, into a
// rules file and runs promtool check rules on it. It returns promtool's
// complaint, with the queries it names, or nil.
func promtoolCheck(t *testing.T, promtool string, qs []query) error {
	t.Helper()
	var rules []recordRule
	for i, q := range qs {
		rules = append(rules, recordRule{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: q.expr})
	}
	data, err := json.MarshalIndent(rulesFile{Groups: []rulesGroup{{Name: "dashboard", Rules: rules}}}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard.rules.yml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	// Two panels may well ask the same: no lint for duplicate rules.
	out, err := exec.Command(promtool, "check", "rules", "--lint=none", path).CombinedOutput()
	if err == nil {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "promtool check rules: %v\n%s\nthe queries, in order:\n", err, out)
	for i, q := range qs {
		fmt.Fprintf(&b, "  %d. %s: %s\n", i, q.where, q.expr)
	}
	return fmt.Errorf("%s", b.String())
}

// findPromtool returns promtool's path, or skips the test without it
// (fails, with LEASEHOLD_REQUIRE_PROMTOOL set).
func findPromtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("LEASEHOLD_REQUIRE_PROMTOOL") != "" {
			t.Fatalf("LEASEHOLD_REQUIRE_PROMTOOL is set and promtool cannot be found: %v", err)
		}
		t.Skipf("promtool is not installed (scripts/check-rules installs it): the dashboard's queries were not parsed")
	}
	return path
}

// TestDashboardQueries checks every query of the dashboard with promtool,
// Grafana's variables replaced by values of their kind; and that the
// check itself refuses what it must.
func TestDashboardQueries(t *testing.T) {
	t.Parallel()
	d, _ := load(t)
	qs := queries(t, d)
	if len(qs) == 0 {
		t.Fatal("the dashboard makes no query")
	}
	var expanded []query
	for _, q := range qs {
		e, err := expand(q.expr)
		if err != nil {
			t.Errorf("%s: %v", q.where, err)
			continue
		}
		if !strings.Contains(e, "leasehold_") && !strings.Contains(e, "grpc_server_") {
			t.Errorf("%s reads no metric of Leasehold's: %s", q.where, q.expr)
		}
		expanded = append(expanded, query{where: q.where, expr: e})
	}

	t.Run("Variables are replaced, and only known ones in their place", func(t *testing.T) {
		for _, c := range []struct {
			expr, want string
		}{
			{`rate(leasehold_jobs_submitted_total{team=~"$team"}[$__rate_interval])`, `rate(leasehold_jobs_submitted_total{team=~".*"}[5m])`},
			{`increase(leasehold_raft_leader_changes_total[$__range])`, `increase(leasehold_raft_leader_changes_total[1h])`},
		} {
			if got, err := expand(c.expr); err != nil || got != c.want {
				t.Errorf("expand(%s) = %s, %v; want %s", c.expr, got, err, c.want)
			}
		}
		for _, bad := range []string{
			`leasehold_queue_depth{team="$team"}`,
			`leasehold_queue_depth{instance=~"$instance"}`,
			`rate(leasehold_jobs_submitted_total[${__rate_interval}])`,
		} {
			if got, err := expand(bad); err == nil {
				t.Errorf("expand(%s) = %s, want an error", bad, got)
			}
		}
	})

	t.Run("promtool parses every query", func(t *testing.T) {
		promtool := findPromtool(t)
		if err := promtoolCheck(t, promtool, expanded); err != nil {
			t.Error(err)
		}
		// The check refuses what is not PromQL: the planted mistake must
		// be caught, else the dashboard's pass says nothing.
		broken := append(expanded[:len(expanded):len(expanded)], query{where: "planted", expr: "sum by (team) (rate(leasehold_jobs_submitted_total[5m])"})
		if err := promtoolCheck(t, promtool, broken); err == nil {
			t.Error("promtool accepted an expression with an unclosed parenthesis")
		}
	})
}
