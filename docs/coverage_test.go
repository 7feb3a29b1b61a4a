package docs

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/rogpeppe/go-internal/txtar"
)

// Pages and scripts are compared command by command, in a normal form:
// whitespace collapsed, `bin/` dropped, `export` written as testscript's
// `env`, the default addresses written as the scripts' variables, and
// exec, conditions, negation and background markers left out of script
// lines. A page's command a script cannot run here (kubectl, scripts/up,
// a command for another host) must be declared in a comment line
// "# not run here: COMMAND (why)"; the programs' commands are run where
// they can be.

// addressVars are the documented default addresses and the script
// variables that stand for them.
var addressVars = strings.NewReplacer("127.0.0.1:7070", "$ADDR", "127.0.0.1:7071", "$METRICS", "127.0.0.1:7072", "$SPARE")

// notRunHere marks a page's command a script cannot run.
const notRunHere = "# not run here: "

var spaces = regexp.MustCompile(`\s+`)

// docCommands returns the commands of the shell blocks of a Markdown page
// in normal form.
func docCommands(t *testing.T, page string) []string {
	t.Helper()
	data, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	inBlock := false
	var pending string
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case !inBlock && (trimmed == "```sh" || trimmed == "```bash" || trimmed == "```shell"):
			inBlock = true
			continue
		case inBlock && trimmed == "```":
			inBlock = false
			continue
		case !inBlock:
			continue
		}
		if pending == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		pending += " " + line
		if strings.Count(pending, "'")%2 == 1 {
			continue // a quoted string goes on
		}
		if strings.HasSuffix(trimmed, `\`) {
			pending = strings.TrimSuffix(strings.TrimSpace(pending), `\`)
			continue
		}
		if cmd := normalDoc(pending); cmd != "" {
			cmds = append(cmds, cmd)
		}
		pending = ""
	}
	return cmds
}

// normalDoc puts one logical line of a shell block in normal form.
func normalDoc(line string) string {
	line = stripComment(line)
	line = strings.TrimSpace(spaces.ReplaceAllString(line, " "))
	if rest, ok := strings.CutPrefix(line, "export "); ok {
		line = "env " + rest
	}
	line = strings.TrimPrefix(line, "bin/")
	return singleQuoted(addressVars.Replace(line))
}

// singleQuoted rewrites the shell's double-quoted words in single quotes,
// testscript's only quoting, where their content allows it.
func singleQuoted(line string) string {
	var b strings.Builder
	for i := 0; i < len(line); i++ {
		switch c := line[i]; c {
		case '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return line
			}
			b.WriteString(line[i : i+j+2])
			i += j + 1
		case '"':
			j := strings.IndexByte(line[i+1:], '"')
			if j < 0 {
				return line
			}
			content := line[i+1 : i+1+j]
			if strings.ContainsAny(content, "'$`\\") {
				return line
			}
			b.WriteString("'" + content + "'")
			i += j + 1
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// stripComment drops a shell comment: a # after a space, outside quotes.
func stripComment(line string) string {
	var quote rune
	prev := ' '
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (prev == ' ' || prev == '\t'):
			return line[:i]
		}
		prev = r
	}
	return line
}

// scriptCommands returns the commands of a testscript in normal form, and
// the commands its comments declare not run here.
func scriptCommands(t *testing.T, script string) (run, notRun []string) {
	t.Helper()
	a, err := txtar.ParseFile(script)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(a.Comment)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, notRunHere); ok {
			notRun = append(notRun, rest)
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		for len(fields) > 0 && (strings.HasPrefix(fields[0], "[") || fields[0] == "!") {
			fields = fields[1:]
		}
		switch {
		case len(fields) > 0 && fields[0] == "exec":
			fields = fields[1:]
		case len(fields) > 2 && (fields[0] == "exitcode" || fields[0] == "waitfor"):
			fields = fields[2:] // exitcode N CMD..., waitfor REGEXP CMD...
		}
		if n := len(fields); n > 0 && strings.HasPrefix(fields[n-1], "&") && strings.HasSuffix(fields[n-1], "&") {
			fields = fields[:n-1]
		}
		run = append(run, strings.Join(fields, " "))
	}
	return run, notRun
}

// checkCovered fails the test for every command of page that script
// neither runs nor declares not run here, with the reason; and for a
// declaration of a command the page no longer shows.
func checkCovered(t *testing.T, page, script string) {
	t.Helper()
	if _, err := os.Stat(script); err != nil {
		t.Errorf("%s has no script: %v", page, err)
		return
	}
	run, notRun := scriptCommands(t, script)
	cmds := docCommands(t, page)
	for _, cmd := range cmds {
		if slices.Contains(run, cmd) {
			continue
		}
		if !slices.ContainsFunc(notRun, func(s string) bool { return strings.HasPrefix(s, cmd+" (") }) {
			t.Errorf("%s shows\n\t%s\nwhich %s neither runs nor declares with %q", page, cmd, script, notRunHere+cmd+" (why)")
		}
	}
	for _, decl := range notRun {
		if !slices.ContainsFunc(cmds, func(cmd string) bool { return strings.HasPrefix(decl, cmd+" (") }) {
			t.Errorf("%s declares %q, a command %s does not show (any more)", script, notRunHere+decl, page)
		}
	}
}

// hasBlocks reports whether page shows a shell or a JSON block, which a
// script must then run or hold.
func hasBlocks(t *testing.T, page string) bool {
	t.Helper()
	data, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	return len(docCommands(t, page)) > 0 || jsonBlock.Match(data)
}

// jsonBlock is a fenced JSON block of a Markdown page, its content the
// first group.
var jsonBlock = regexp.MustCompile("(?s)```json\n(.*?)```")

// anchors returns the fragments that name the headings of a Markdown
// page, as GitHub makes them: the heading's text without its formatting,
// in lower case, with spaces as hyphens and other punctuation dropped; a
// repeated one gets -1, -2 and so on.
func anchors(page string) []string {
	var out []string
	seen := map[string]int{}
	fence := ""
	sc := bufio.NewScanner(strings.NewReader(page))
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if f := fenceOf(trimmed); f != "" {
			switch {
			case fence == "":
				fence = f
			case strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "":
				fence = ""
			}
			continue
		}
		if fence != "" || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimLeft(line, "#")
		if !strings.HasPrefix(text, " ") || len(line)-len(text) > 6 {
			continue
		}
		text = markdownLink.ReplaceAllString(strings.TrimSpace(text), "$1")
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
				b.WriteRune(r)
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			seen[slug] = n + 1
			slug = fmt.Sprintf("%s-%d", slug, n)
		} else {
			seen[slug] = 1
		}
		out = append(out, slug)
	}
	return out
}

// markdownLink is an inline link, its text the first group.
var markdownLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// fenceOf returns the fence a line opens or closes (three or more
// backticks or tildes), or "".
func fenceOf(line string) string {
	for _, c := range []string{"`", "~"} {
		if n := len(line) - len(strings.TrimLeft(line, c)); n >= 3 {
			return line[:n]
		}
	}
	return ""
}

// checkJSONBlocks fails the test for every JSON block of page that is not
// a file of script, so that examples such as a principals file are used
// as shown.
func checkJSONBlocks(t *testing.T, page, script string) {
	t.Helper()
	data, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	a, err := txtar.ParseFile(script)
	if err != nil {
		t.Fatal(err)
	}
	blocks := jsonBlock.FindAllStringSubmatch(string(data), -1)
	for _, b := range blocks {
		if !slices.ContainsFunc(a.Files, func(f txtar.File) bool { return string(f.Data) == b[1] }) {
			t.Errorf("%s shows a JSON block that is no file of %s:\n%s", page, script, b[1])
		}
	}
}

func TestAnchors(t *testing.T) {
	t.Parallel()
	page := "# Leasehold\n" +
		"## Submit, watch, download, cancel, replay: the CLI\n" +
		"```sh\n# not a heading\n```\n" +
		"### Retention, backup and restore\n" +
		"## The `deploy/` [manifests](../deploy/README.md)\n" +
		"## Errors\n## Errors\n" +
		"#hashtag\n####### seven\n"
	want := []string{"leasehold", "submit-watch-download-cancel-replay-the-cli", "retention-backup-and-restore",
		"the-deploy-manifests", "errors", "errors-1"}
	if got := anchors(page); !slices.Equal(got, want) {
		t.Errorf("anchors:\n got %q\nwant %q", got, want)
	}
}
