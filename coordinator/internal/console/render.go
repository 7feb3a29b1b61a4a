package console

import (
	"bytes"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
	"unicode"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// templates are the parsed pages: each page template is parsed together
// with the layout, and may define a "live" block that htmx refreshes.
type templates struct {
	byName map[string]*template.Template
}

// parseTemplates parses every page under templates/ with layout.html.
func parseTemplates() (*templates, error) {
	t := &templates{byName: map[string]*template.Template{}}
	pages, err := fs.Glob(files, "templates/*.html")
	if err != nil {
		return nil, err
	}
	for _, p := range pages {
		name := strings.TrimSuffix(path.Base(p), ".html")
		if name == "layout" || name == "partials" {
			continue
		}
		tt, err := template.New("layout.html").Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/partials.html", p)
		if err != nil {
			return nil, fmt.Errorf("console: parsing %s: %w", p, err)
		}
		if tt.Lookup("live") == nil {
			template.Must(tt.New("live").Parse(""))
		}
		t.byName[name] = tt
	}
	return t, nil
}

// view is what every page template gets.
type view struct {
	Title string
	// Page names the page for the navigation's aria-current.
	Page string
	// Who is the signed-in principal, nil on the sign-in and error pages
	// of a signed-out browser.
	Who *whoView
	// Data is the page's own.
	Data any
}

// whoView is the signed-in principal as the layout shows it, with what the
// services would allow it (the handlers' own predicates).
type whoView struct {
	Name     string
	Roles    string
	Scope    string
	CSRF     string
	Operates bool
	Pauses   bool
}

func whoOf(sess *session) *whoView {
	if sess == nil {
		return nil
	}
	p := sess.principal
	roles := make([]string, len(p.Roles))
	for i, r := range p.Roles {
		roles[i] = string(r)
	}
	scope := strings.Join(p.Scope, ", ")
	if p.Team != "" {
		scope = strings.TrimPrefix(scope+", team "+p.Team, ", ")
	}
	return &whoView{Name: p.Name, Roles: strings.Join(roles, ", "), Scope: scope, CSRF: sess.csrf,
		Operates: p.CanOperate(), Pauses: p.CanPause()}
}

// titles are the pages' titles.
var titles = map[string]string{
	"overview": "Overview", "batches": "Batches", "batch": "Batch", "job": "Job", "renderers": "Renderers",
	"rejections": "Rejected completions", "audit": "Audit log", "replay": "Replay", "signin": "Sign in", "error": "Error",
}

// render executes page with data as the response, or only its "live"
// block when htmx asks for it (?part=live).
func (c *Console) render(w http.ResponseWriter, r *http.Request, code int, page string, sess *session, data any) {
	t := c.pages.byName[page]
	v := view{Title: titles[page], Page: page, Who: whoOf(sess), Data: data}
	if ev, ok := data.(errorView); ok {
		v.Title = ev.Title
	}
	name := "layout.html"
	if r.URL.Query().Get("part") == "live" && r.Method == http.MethodGet {
		name = "live"
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, name, v); err != nil {
		c.log.Error("console: rendering a page", "page", page, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"phase":    func(p leaseholdv1.Phase) string { return shortEnum(p.String(), "PHASE_") },
	"reason":   func(r leaseholdv1.TerminalReason) string { return shortEnum(r.String(), "TERMINAL_REASON_") },
	"kind":     func(k leaseholdv1.EventKind) string { return shortEnum(k.String(), "EVENT_KIND_") },
	"action":   func(a leaseholdv1.ReplayAction) string { return shortEnum(a.String(), "REPLAY_ACTION_") },
	"time":     formatTime,
	"age":      formatAge,
	"until":    formatUntil,
	"percent":  func(f float64) string { return fmt.Sprintf("%.0f%%", f*100) },
	"rate":     func(f float64) string { return fmt.Sprintf("%.1f", f) },
	"count":    countOf,
	"terminal": isTerminal,
	"lower":    strings.ToLower,
	"join":     strings.Join,
	"labelled": func(by string, rows any) labelledRows { return labelledRows{By: by, Rows: rows} },
}

// labelledRows is what a shared table partial gets: its rows, and the id
// of the page's heading that names the table for screen readers.
type labelledRows struct {
	By   string
	Rows any
}

// shortEnum strips an enum name's prefix; the unspecified value is "-".
func shortEnum(name, prefix string) string {
	s := strings.TrimPrefix(name, prefix)
	if s == "UNSPECIFIED" || s == "" {
		return "-"
	}
	return s
}

// formatTime shows a timestamp in UTC to the second, "-" when unset.
func formatTime(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format("2006-01-02 15:04:05Z")
}

// formatAge shows a duration rounded for people, "-" when unset.
func formatAge(d *durationpb.Duration) string {
	if d == nil {
		return "-"
	}
	return roundDuration(d.AsDuration()).String()
}

// formatUntil shows how long from asOf until t, "-" when unset.
func formatUntil(t, asOf *timestamppb.Timestamp) string {
	if t == nil || asOf == nil {
		return "-"
	}
	return roundDuration(t.AsTime().Sub(asOf.AsTime())).String()
}

func roundDuration(d time.Duration) time.Duration {
	switch {
	case d > time.Hour || d < -time.Hour:
		return d.Round(time.Minute)
	case d > 10*time.Second || d < -10*time.Second:
		return d.Round(time.Second)
	}
	return d.Round(100 * time.Millisecond)
}

// countOf returns the count of phase p in counts.
func countOf(counts []*leaseholdv1.PhaseCount, p string) uint32 {
	for _, c := range counts {
		if c.GetPhase().String() == "PHASE_"+p {
			return c.GetCount()
		}
	}
	return 0
}

func isTerminal(p leaseholdv1.Phase) bool {
	return p == leaseholdv1.Phase_PHASE_SUCCEEDED || p == leaseholdv1.Phase_PHASE_FAILED || p == leaseholdv1.Phase_PHASE_CANCELLED
}

// codeName is a gRPC code as the API documents it (NOT_FOUND).
func codeName(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}
