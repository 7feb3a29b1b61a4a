// Package docs holds no code: its tests run what the documentation tells
// a reader to run. The README's walk-through has testdata/readme.txtar,
// each page docs/NAME.md that shows shell or JSON blocks has
// testdata/NAME.txtar, and each runbook of docs/runbooks/ has a script in
// testdata/runbooks/; they start real coordinators and renderers from
// the built binaries on free loopback ports, run the documented commands
// and assert on what the pages say they print. A command shown in a page
// (a shell block, with `bin/` dropped and 127.0.0.1:7070 written $ADDR)
// that its script does not run fails the test, so a page cannot gain a
// command nobody runs.
package docs

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
	"go.etcd.io/bbolt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/internal/security/securitytest"
	"github.com/leasehold/leasehold/internal/stack"
	"github.com/leasehold/leasehold/internal/testbin"
)

// binDir holds the binaries under test (see package testbin).
var binDir string

// moduleRoot is the repository root.
var moduleRoot string

func TestMain(m *testing.M) {
	testbin.Main("docs", func(root, dir string) int {
		moduleRoot, binDir = root, dir
		return m.Run()
	}, append(slices.Clone(testbin.Names), testbin.S3Server)...)
}

// waitTimeout bounds every wait of the scripts' own commands; they end as
// soon as what they wait for happens.
const waitTimeout = 30 * time.Second

// programs are the binaries the pages show, run by the scripts with exec.
var programs = []string{"leasehold", "coordinator", "renderer", "grpcurl", testbin.S3Server}

// TestRunbooks runs testdata/runbooks/NAME.txtar for every
// docs/runbooks/NAME.md, after checking that each script runs its page's
// commands.
func TestRunbooks(t *testing.T) {
	pages, err := filepath.Glob(filepath.Join("runbooks", "*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no runbooks: %v", err)
	}
	var scripts []string
	for _, page := range pages {
		name := strings.TrimSuffix(filepath.Base(page), ".md")
		script := filepath.Join("testdata", "runbooks", name+".txtar")
		if len(docCommands(t, page)) == 0 {
			t.Errorf("%s shows no commands in shell blocks", page)
		}
		checkCovered(t, page, script)
		checkJSONBlocks(t, page, script)
		scripts = append(scripts, script)
	}
	all, _ := filepath.Glob(filepath.Join("testdata", "runbooks", "*.txtar"))
	for _, s := range all {
		if !slices.Contains(scripts, s) {
			t.Errorf("%s has no page docs/runbooks/%s.md", s, strings.TrimSuffix(filepath.Base(s), ".txtar"))
		}
	}
	testscript.Run(t, params(scripts, tlsFiles(t), nil))
}

// TestPages replays the README and the pages of docs/: the README's
// walk-through (testdata/readme.txtar, a stack like scripts/up on free
// ports, then the commands of the CLI and grpcurl sections) and
// testdata/NAME.txtar for each docs/NAME.md, after checking that each
// script runs its page's commands. A page that shows no shell or JSON
// block needs no script. Every script's work directory holds copies of
// README.md and proto/leasehold/v1/, which the walk-through submits.
func TestPages(t *testing.T) {
	readme := filepath.Join(moduleRoot, "README.md")
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{readme}, pages...)
	var scripts []string
	for _, page := range pages {
		script := pageScript(page)
		if _, err := os.Stat(script); err != nil {
			if hasBlocks(t, page) {
				t.Errorf("%s shows shell or JSON blocks but has no script: %v", page, err)
			}
			continue
		}
		checkCovered(t, page, script)
		checkJSONBlocks(t, page, script)
		scripts = append(scripts, script)
	}
	if len(docCommands(t, readme)) == 0 {
		t.Errorf("%s shows no commands in shell blocks", readme)
	}
	if n := lineCount(t, readme); n > frontPageLines {
		t.Errorf("%s has %d lines: the front page holds at most %d (what it is, the two commands, the walk-through, where to read next); move reference text to a page of docs/", readme, n, frontPageLines)
	}
	all, _ := filepath.Glob(filepath.Join("testdata", "*.txtar"))
	for _, s := range all {
		if !slices.Contains(scripts, s) {
			t.Errorf("%s has no page docs/%s.md", s, strings.TrimSuffix(filepath.Base(s), ".txtar"))
		}
	}
	testscript.Run(t, params(scripts, tlsFiles(t), func(env *testscript.Env) error {
		if err := copyFile(readme, filepath.Join(env.WorkDir, "README.md")); err != nil {
			return err
		}
		protos, err := filepath.Glob(filepath.Join(moduleRoot, "proto", "leasehold", "v1", "*.proto"))
		if err != nil || len(protos) == 0 {
			return fmt.Errorf("no protos: %v", err)
		}
		for _, p := range protos {
			if err := copyFile(p, filepath.Join(env.WorkDir, "proto", "leasehold", "v1", filepath.Base(p))); err != nil {
				return err
			}
		}
		return nil
	}))
}

// frontPageLines bounds the README, so that it stays a newcomer's front
// page and the reference grows in docs/.
const frontPageLines = 300

// lineCount is the number of lines of the file at path.
func lineCount(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(data, []byte("\n"))
}

// pageScript names the script of a page: testdata/readme.txtar for the
// repository's README, testdata/NAME.txtar for docs/NAME.md.
func pageScript(page string) string {
	if filepath.Dir(page) != "." {
		return filepath.Join("testdata", "readme.txtar")
	}
	return filepath.Join("testdata", strings.TrimSuffix(page, ".md")+".txtar")
}

// TestLinks checks that every relative link of the README, of the pages
// of docs/ and of the runbooks names a file that exists, and a link with
// a fragment to a Markdown page a heading of that page.
func TestLinks(t *testing.T) {
	t.Parallel()
	pages, _ := filepath.Glob(filepath.Join("runbooks", "*.md"))
	docPages, _ := filepath.Glob("*.md")
	pages = append(pages, docPages...)
	pages = append(pages, filepath.Join(moduleRoot, "README.md"), filepath.Join(moduleRoot, "deploy", "README.md"))
	link := regexp.MustCompile(`\]\(([^)#\s]*)(#[^)\s]*)?\)`)
	for _, page := range pages {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, m := range link.FindAllStringSubmatch(string(data), -1) {
			target, fragment := m[1], strings.TrimPrefix(m[2], "#")
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || target == "" && fragment == "" {
				continue
			}
			file := page
			if target != "" {
				file = filepath.Join(filepath.Dir(page), target)
			}
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s links %s: %v", page, target, err)
				continue
			}
			if fragment == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			headings, err := os.ReadFile(file)
			if err != nil {
				t.Error(err)
				continue
			}
			if !slices.Contains(anchors(string(headings)), fragment) {
				t.Errorf("%s links %s#%s, a heading %s does not have (it has %v)", page, target, fragment, file, anchors(string(headings)))
			}
		}
	}
}

// tlsServerName is the name on the scripts' server certificate: the
// Service's, which the runbooks verify through a port-forward.
const tlsServerName = "leasehold-coordinator"

// tlsFiles returns the files of a CA and a server certificate it signed
// for tlsServerName, by the names the runbooks use: ca.crt, and tls.crt
// and tls.key as a kubernetes.io/tls Secret holds them.
func tlsFiles(t *testing.T) map[string][]byte {
	ca := securitytest.NewCA(t, "leasehold docs test CA")
	certPEM, keyPEM := securitytest.KeyPairPEM(t, ca.ServerFor(t, tlsServerName))
	return map[string][]byte{"ca.crt": ca.PEM(), "tls.crt": certPEM, "tls.key": keyPEM}
}

// params are the testscript parameters every script runs with: the
// binaries on PATH, free loopback addresses, the files of tlsFiles in the
// work directory, and the commands below.
func params(files []string, certs map[string][]byte, setup func(*testscript.Env) error) testscript.Params {
	return testscript.Params{
		Files:               files,
		RequireExplicitExec: true,
		RequireUniqueNames:  true,
		Setup: func(env *testscript.Env) error {
			env.Setenv("PATH", binDir+string(os.PathListSeparator)+env.Getenv("PATH"))
			// The scripts' own addresses: the coordinator's gRPC and
			// metrics, a spare one, a renderer's HTTP endpoint, and the
			// gRPC and raft addresses of the nodes of a cluster.
			for _, name := range []string{"ADDR", "METRICS", "SPARE", "HTTP1", "N1", "N2", "N3", "R1", "R2", "R3"} {
				addr, err := testbin.FreeAddr()
				if err != nil {
					return err
				}
				env.Setenv(name, addr)
			}
			// The CLI's default address stands for 127.0.0.1:7070.
			env.Setenv("LEASEHOLD_ADDR", env.Getenv("ADDR"))
			for name, data := range certs {
				if err := os.WriteFile(filepath.Join(env.WorkDir, name), data, 0o600); err != nil {
					return err
				}
			}
			if setup != nil {
				return setup(env)
			}
			return nil
		},
		Condition: condition,
		Cmds: map[string]func(*testscript.TestScript, bool, []string){
			"waithealth": cmdWaitHealth,
			"waitlisten": cmdWaitListen,
			"waitfor":    cmdWaitFor,
			"httpget":    cmdHTTPGet,
			"waitget":    cmdWaitGet,
			"exitcode":   cmdExitCode,
			"mounttmpfs": cmdMountTmpfs,
			"mkfile":     cmdMkfile,
			"bboltput":   cmdBboltPut,
		},
	}
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o644)
}

// condition answers the scripts' own conditions:
//
//   - [tmpfs]: this process may mount a small tmpfs (root with
//     CAP_SYS_ADMIN), to fill a disk for real;
//   - [cmd:NAME]: the CLI has the command NAME ("leasehold help NAME"
//     succeeds), for pages written ahead of a command.
func condition(cond string) (bool, error) {
	switch {
	case cond == "tmpfs":
		return canMountTmpfs(), nil
	case strings.HasPrefix(cond, "cmd:"):
		cmd := exec.Command(filepath.Join(binDir, "leasehold"), "help", strings.TrimPrefix(cond, "cmd:"))
		cmd.Env = testbin.Env()
		return cmd.Run() == nil, nil
	}
	return false, fmt.Errorf("unknown condition %q", cond)
}

var (
	tmpfsOnce sync.Once
	tmpfsOK   bool
)

// canMountTmpfs tries once to mount and unmount a small tmpfs.
func canMountTmpfs() bool {
	tmpfsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "leasehold-tmpfs-probe-")
		if err != nil {
			return
		}
		defer os.Remove(dir)
		if syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k") != nil {
			return
		}
		tmpfsOK = syscall.Unmount(dir, syscall.MNT_DETACH) == nil
	})
	return tmpfsOK
}

// cmdMountTmpfs mounts a tmpfs of SIZE at DIR (created if missing), or
// with -remount changes the size of the one mounted there; it is
// unmounted when the script ends.
//
//	mounttmpfs [-remount] DIR SIZE
func cmdMountTmpfs(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("unsupported: ! mounttmpfs")
	}
	remount := len(args) > 0 && args[0] == "-remount"
	if remount {
		args = args[1:]
	}
	if len(args) != 2 {
		ts.Fatalf("usage: mounttmpfs [-remount] DIR SIZE")
	}
	dir := ts.MkAbs(args[0])
	var flags uintptr
	if remount {
		flags = syscall.MS_REMOUNT
	} else {
		ts.Check(os.MkdirAll(dir, 0o755))
		ts.Defer(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", flags, "size="+args[1]); err != nil {
		ts.Fatalf("mounting a tmpfs of %s at %s: %v", args[1], dir, err)
	}
}

// cmdWaitHealth waits until the health entry SERVICE of the coordinator at
// ADDR reports STATUS (SERVING, NOT_SERVING), connecting as soon as the
// coordinator listens. The server's own entry is the empty name, an
// empty pair of single quotes in a script. With LEASEHOLD_TLS_CA set in
// the script, it connects over TLS as the CLI does (see scriptTLS).
//
//	waithealth ADDR SERVICE STATUS
func cmdWaitHealth(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: waithealth ADDR SERVICE STATUS")
	}
	want, ok := healthpb.HealthCheckResponse_ServingStatus_value[args[2]]
	if !ok {
		ts.Fatalf("unknown status %q", args[2])
	}
	// Retry the connection often: the coordinator may be starting.
	retry := grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 200 * time.Millisecond}}
	creds := insecure.NewCredentials()
	if cfg := scriptTLS(ts); cfg != nil {
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(args[0], grpc.WithTransportCredentials(creds), grpc.WithConnectParams(retry))
	ts.Check(err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := stack.WatchHealth(ctx, healthpb.NewHealthClient(conn), args[1], healthpb.HealthCheckResponse_ServingStatus(want)); err != nil {
		ts.Fatalf("watching the health of %q at %s for %s: %v", args[1], args[0], args[2], err)
	}
}

// scriptEnvNames are the variables a command started by waitfor sees,
// taken from the script's environment (testscript offers no list of it).
var scriptEnvNames = []string{"PATH", "HOME", "TMPDIR", "LEASEHOLD_ADDR", "LEASEHOLD_TOKEN", "LEASEHOLD_TEAM",
	"LEASEHOLD_TLS_CA", "LEASEHOLD_TLS_SERVER_NAME"}

// scriptTLS returns the TLS configuration the CLI would take from the
// script's LEASEHOLD_TLS_CA and LEASEHOLD_TLS_SERVER_NAME, or nil without
// a CA.
func scriptTLS(ts *testscript.TestScript) *tls.Config {
	caFile := ts.Getenv("LEASEHOLD_TLS_CA")
	if caFile == "" {
		return nil
	}
	pem, err := os.ReadFile(ts.MkAbs(caFile))
	ts.Check(err)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		ts.Fatalf("LEASEHOLD_TLS_CA=%s holds no certificate", caFile)
	}
	return &tls.Config{RootCAs: pool, ServerName: ts.Getenv("LEASEHOLD_TLS_SERVER_NAME")}
}

// cmdWaitListen waits until ADDR accepts TCP connections: a server started
// in the background (the S3-compatible store) is up.
//
//	waitlisten ADDR
func cmdWaitListen(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitlisten ADDR")
	}
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", args[0], time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("%s does not accept connections after %v: %v", args[0], waitTimeout, err)
		}
		<-tick.C
	}
}

// cmdWaitFor starts CMD, reads its standard output line by line until a
// line matches REGEXP, then stops it. The lines read are its stdout. It
// fails if CMD ends first or nothing matches in time. Meant for commands
// that stream, like "leasehold watch".
//
//	waitfor REGEXP CMD [ARGS...]
func cmdWaitFor(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: waitfor REGEXP CMD [ARGS...]")
	}
	re, err := regexp.Compile(args[0])
	ts.Check(err)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	path := args[1]
	if !strings.Contains(path, "/") {
		for _, dir := range filepath.SplitList(ts.Getenv("PATH")) {
			if _, err := os.Stat(filepath.Join(dir, path)); err == nil {
				path = filepath.Join(dir, path)
				break
			}
		}
	}
	cmd := exec.CommandContext(ctx, path, args[2:]...)
	cmd.Dir = ts.MkAbs(".")
	for _, name := range scriptEnvNames {
		if v := ts.Getenv(name); v != "" {
			cmd.Env = append(cmd.Env, name+"="+v)
		}
	}
	stdout, err := cmd.StdoutPipe()
	ts.Check(err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	ts.Check(cmd.Start())
	defer func() {
		cancel()
		_ = cmd.Wait()
	}()
	out := ts.Stdout()
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		fmt.Fprintln(out, sc.Text())
		if re.MatchString(sc.Text()) {
			return
		}
	}
	ts.Fatalf("%s ended before a line matched %q: %v\n%s", strings.Join(args[1:], " "), args[0], errors.Join(sc.Err(), ctx.Err()), stderr.String())
}

// cmdHTTPGet prints the body of GET URL. It fails on a status other than
// 200 (with !, on 200). An https URL is verified as waithealth verifies
// the coordinator (scriptTLS).
//
//	httpget URL
func cmdHTTPGet(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 {
		ts.Fatalf("usage: httpget URL")
	}
	code, body, err := httpGet(ts, args[0])
	ts.Check(err)
	fmt.Fprint(ts.Stdout(), body)
	if ok := code == http.StatusOK; ok == neg {
		ts.Fatalf("GET %s: %d %s", args[0], code, http.StatusText(code))
	}
}

// cmdWaitGet gets URL again and again until it answers 200 with a line
// that matches REGEXP, and prints that body: a metric that something
// running in the background moves (a refusal counted). It fails if
// nothing matches in time.
//
//	waitget REGEXP URL
func cmdWaitGet(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: waitget REGEXP URL")
	}
	re, err := regexp.Compile("(?m)" + args[0])
	ts.Check(err)
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		code, body, err := httpGet(ts, args[1])
		if err == nil && code == http.StatusOK && re.MatchString(body) {
			fmt.Fprint(ts.Stdout(), body)
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("GET %s: no line matched %q after %v (status %d, %v):\n%s", args[1], args[0], waitTimeout, code, err, body)
		}
		<-tick.C
	}
}

// httpGet returns the status and the body of GET url.
func httpGet(ts *testscript.TestScript, url string) (int, string, error) {
	var tlsCfg *tls.Config
	if strings.HasPrefix(url, "https://") {
		tlsCfg = scriptTLS(ts)
	}
	client := &http.Client{Timeout: waitTimeout, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: tlsCfg}}
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// cmdExitCode runs a program like exec and checks that it exits with
// status N; its output is then stdout and stderr.
//
//	exitcode N PROGRAM [ARGS...]
func cmdExitCode(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: exitcode N PROGRAM [ARGS...]")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		got = exit.ExitCode()
	case err != nil:
		ts.Fatalf("%s: %v", args[1], err)
	}
	if got != want {
		ts.Fatalf("%s exited with status %d, want %d", args[1], got, want)
	}
}

// cmdMkfile writes a text file of SIZE bytes (lines of letters) at PATH,
// creating its directory, for documents too large to keep in a script.
//
//	mkfile SIZE PATH
func cmdMkfile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: mkfile SIZE PATH")
	}
	size, err := strconv.Atoi(args[0])
	ts.Check(err)
	line := strings.Repeat("abcdefghijklmnopqrstuvwxyz", 3) + "\n"
	content := strings.Repeat(line, size/len(line)+1)[:size]
	path := ts.MkAbs(args[1])
	ts.Check(os.MkdirAll(filepath.Dir(path), 0o755))
	ts.Check(os.WriteFile(path, []byte(content), 0o644))
}

// cmdBboltPut sets KEY in BUCKET of the bbolt file FILE to VALUE, an
// unsigned integer stored as 8 big-endian bytes (how the coordinator's
// store keeps its schema version), to make a file the coordinator must
// refuse, such as one a later release wrote.
//
//	bboltput FILE BUCKET KEY VALUE
func cmdBboltPut(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 4 {
		ts.Fatalf("usage: bboltput FILE BUCKET KEY VALUE")
	}
	v, err := strconv.ParseUint(args[3], 10, 64)
	ts.Check(err)
	db, err := bbolt.Open(ts.MkAbs(args[0]), 0o600, &bbolt.Options{Timeout: time.Second})
	ts.Check(err)
	defer db.Close()
	ts.Check(db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte(args[1]))
		if b == nil {
			return fmt.Errorf("no bucket %q", args[1])
		}
		return b.Put([]byte(args[2]), binary.BigEndian.AppendUint64(nil, v))
	}))
}
