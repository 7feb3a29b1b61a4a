package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer"
)

// logLines decodes JSON log lines, failing the test on a line that is not
// one JSON object.
func logLines(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for line := range strings.Lines(logs) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		lines = append(lines, m)
	}
	return lines
}

// finishedCall returns the first "finished call" line of method with
// code, failing the test if there is none.
func finishedCall(t *testing.T, lines []map[string]any, method, code string) map[string]any {
	t.Helper()
	for _, l := range lines {
		if l["msg"] == "finished call" && l["grpc.method"] == method && l["grpc.code"] == code {
			return l
		}
	}
	t.Fatalf("no finished call line for %s with code %s", method, code)
	return nil
}

// TestLogsNameTheCallerAndNeverTheSecrets runs a coordinator and a
// renderer with JSON logs at Debug, submits a document whose content and
// whose submitter's token carry a marker, and checks that every call's
// line names the method, code, duration, principal and team, and that the
// marker appears in no line, including those written while shutting down.
func TestLogsNameTheCallerAndNeverTheSecrets(t *testing.T) {
	t.Parallel()
	const marker = "MARKER-5f1c9e"
	logs := &syncBuffer{}
	t.Cleanup(func() {
		// Registered first, so it runs last: after the renderer and the
		// coordinator have stopped and written their last lines.
		if strings.Contains(logs.String(), marker) {
			t.Errorf("the logs contain the marker of a token or of document content:\n%s", logs)
		}
	})
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	dir := t.TempDir()
	tokens := filepath.Join(dir, "principals.json")
	principals := `{"principals": [
		{"name": "alpha-svc", "token": "alpha-` + marker + `", "team": "alpha", "roles": ["submitter"]},
		{"name": "render-pool", "token": "render-` + marker + `", "roles": ["renderer"], "renderer_ids": ["*"]}
	]}`
	if err := os.WriteFile(tokens, []byte(principals), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startStack(t, Config{TokensFile: tokens, DataDir: filepath.Join(dir, "data"), Logger: log.With("process", "coordinator")})
	s.startRenderer(t, renderer.Config{Token: "render-" + marker, Logger: log.With("process", "renderer")})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cl, err := client.Dial(s.addr, client.WithToken("alpha-"+marker))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	content := []byte("confidential " + marker + " report")
	batch := submitAndWait(t, ctx, cl, "alpha", &leaseholdv1.Document{Name: "report.txt", ContentType: "text/plain", Content: content})
	var preview bytes.Buffer
	if _, err := cl.DownloadArtifact(ctx, batch.GetJobIds()[0], &preview); err != nil {
		t.Fatalf("DownloadArtifact: %v", err)
	}
	impostor, err := client.Dial(s.addr, client.WithToken("wrong-"+marker))
	if err != nil {
		t.Fatal(err)
	}
	defer impostor.Close()
	if _, err := impostor.GetJob(ctx, "j-1"); !errors.Is(err, client.ErrUnauthenticated) {
		t.Fatalf("GetJob with an unknown token = %v, want ErrUnauthenticated", err)
	}

	lines := logLines(t, logs.String())
	submit := finishedCall(t, lines, "SubmitBatch", "OK")
	for k, want := range map[string]any{
		"grpc.service": "leasehold.v1.JobService", "principal": "alpha-svc", "team": "alpha", "level": "DEBUG",
	} {
		if submit[k] != want {
			t.Errorf("SubmitBatch line %s = %v, want %v", k, submit[k], want)
		}
	}
	if _, ok := submit["grpc.time_ms"]; !ok {
		t.Errorf("SubmitBatch line has no duration: %v", submit)
	}
	refused := finishedCall(t, lines, "GetJob", "Unauthenticated")
	if refused["level"] != "INFO" {
		t.Errorf("refused GetJob line = %v, want it at INFO", refused)
	}
	if _, ok := refused["principal"]; ok {
		t.Errorf("a refused call names a principal: %v", refused)
	}
}
