package coordinator

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
)

// dashboardFile is the Grafana dashboard of deploy/, whose queries
// TestDashboardReadsExportedSeries checks.
var dashboardFile = filepath.Join("..", "deploy", "grafana", "leasehold.json")

// promTargetLabels are the labels Prometheus itself gives every series it
// scrapes.
var promTargetLabels = []string{"instance", "job"}

// TestDashboardReadsExportedSeries checks every query of the Grafana
// dashboard against what the programs export: each metric it reads must be
// served by a cluster's leader (which exports what a single node does,
// and the raft side), a follower or a renderer, and each label it selects
// on or groups by must be one of theirs or one Prometheus adds. The
// cluster has done what makes the labelled series appear: a job rendered,
// a job refused at submission, the followers caught up. (Package
// deploy/grafana checks the queries' syntax with promtool.)
func TestDashboardReadsExportedSeries(t *testing.T) {
	t.Parallel()
	const rendererToken = "renderer-token-0123456789abcdef"
	tokens := filepath.Join(t.TempDir(), "principals.json")
	if err := os.WriteFile(tokens, []byte(`{"principals":[
		{"name":"admin","token":"`+adminToken+`","roles":["operator"],"scope":["*"]},
		{"name":"alpha-svc","token":"`+submitterToken+`","team":"alpha","roles":["submitter"]},
		{"name":"render-pool","token":"`+rendererToken+`","roles":["renderer"],"renderer_ids":["*"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tc := startOpsCluster(t, 3, func(cfg *Config) { cfg.TokensFile = tokens })
	leader := waitLeader(t, tc.nodes...)
	var addrs []string
	for _, nd := range tc.nodes {
		addrs = append(addrs, nd.addr)
	}
	provider, err := mock.New(mock.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := renderer.New(renderer.Config{Coordinator: strings.Join(addrs, ","), ID: "r-1", Token: rendererToken,
		Provider: provider, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, drain := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(rctx) }()
	t.Cleanup(func() {
		drain()
		if err := <-ran; err != nil {
			t.Errorf("renderer Run: %v", err)
		}
	})

	// A failsafe: a call that waits for what never comes fails the test.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sub := dialNode(t, leader, submitterToken)
	resp, err := sub.SubmitBatch(ctx, "alpha", "dashboard-1", []*leaseholdv1.Document{
		{Name: "a.pdf", ContentType: "application/pdf", Content: []byte("%PDF-1.7")},
		{Name: "b.docm", Content: []byte("PK")},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range sub.FollowBatch(ctx, resp.GetBatch().GetId(), client.FollowOptions{TerminalOnly: true}) {
		if err != nil {
			t.Fatal(err)
		}
	}
	admin := dialNode(t, leader, adminToken)
	eventually(t, "every follower caught up", func() bool { return allReplicated(t, admin, 3) })

	names, labels := map[string]bool{}, map[string]bool{}
	for _, l := range promTargetLabels {
		labels[l] = true
	}
	for _, nd := range tc.nodes {
		exposition(scrape(t, nd), names, labels)
	}
	rec := httptest.NewRecorder()
	w.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("renderer GET /metrics = %d", rec.Code)
	}
	exposition(rec.Body.String(), names, labels)

	exprs := dashboardExprs(t)
	var read []string
	for _, e := range exprs {
		for _, m := range metricRef.FindAllString(e, -1) {
			read = append(read, m)
			if !names[m] {
				t.Errorf("the dashboard reads %s, which neither the coordinators nor the renderer export, in %s", m, e)
			}
		}
		for _, l := range labelRefs(e) {
			if !labels[l] {
				t.Errorf("the dashboard selects or groups by label %q, which no exported series carries, in %s", l, e)
			}
		}
	}
	// The metrics the dashboard is for: losing one loses its panel.
	for _, want := range []string{"leasehold_queue_depth", "leasehold_jobs_finished_total", "leasehold_jobs_failed_total",
		"leasehold_jobs_expired_total", "leasehold_rejected_completions_total", "leasehold_rejected_completions_unrecorded_total",
		"leasehold_writer_group_commands_bucket", "leasehold_writer_group_seconds_bucket", "leasehold_live_renderer_capacity",
		"leasehold_raft_leader", "leasehold_raft_term", "leasehold_raft_leader_changes_total", "leasehold_raft_commit_seconds_bucket",
		"leasehold_raft_apply_seconds_bucket", "leasehold_raft_follower_lag_entries", "leasehold_raft_follower_last_contact_seconds"} {
		if !slices.Contains(read, want) {
			t.Errorf("the dashboard no longer reads %s", want)
		}
	}
}

// metricRef finds the Leasehold and gRPC server metrics an expression
// reads.
var metricRef = regexp.MustCompile(`\b(?:leasehold_[a-z0-9_]+|grpc_server_[a-z0-9_]+)\b`)

// exposition adds the metric names and label names of a /metrics body
// (Prometheus text format) to names and labels.
func exposition(body string, names, labels map[string]bool) {
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		names[name] = true
		if set, _, ok := strings.Cut(rest, "} "); ok {
			for _, m := range exposedLabel.FindAllStringSubmatch(set, -1) {
				labels[m[1]] = true
			}
		}
	}
}

// exposedLabel finds the label names of a series' label set.
var exposedLabel = regexp.MustCompile(`(?:^|,)([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"`)

// The labels an expression names: in matchers ({team=~"..."}), in by,
// without, on, ignoring, group_left and group_right lists, and as
// label_values' second argument.
var (
	matcherSet   = regexp.MustCompile(`\{([^}]*)\}`)
	matcherLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"`)
	labelList    = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	valuesOf     = regexp.MustCompile(`^label_values\(.+,\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)
)

// labelRefs returns the label names expr selects on or groups by.
func labelRefs(expr string) []string {
	var out []string
	for _, set := range matcherSet.FindAllStringSubmatch(expr, -1) {
		for _, m := range matcherLabel.FindAllStringSubmatch(set[1], -1) {
			out = append(out, m[1])
		}
	}
	if m := valuesOf.FindStringSubmatch(expr); m != nil {
		out = append(out, m[1])
	}
	for _, list := range labelList.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(list[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	return out
}

// dashboardExprs returns the PromQL of every panel query and query
// variable of the dashboard, wherever it is nested.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Templating struct {
			List []struct {
				Type  string `json:"type"`
				Query string `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	var raw any
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			out = append(out, v.Query)
		}
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if e, ok := v["expr"].(string); ok {
				out = append(out, e)
			}
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(raw)
	if len(out) == 0 {
		t.Fatalf("%s holds no query", dashboardFile)
	}
	return out
}
