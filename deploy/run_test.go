package deploy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/internal/testbin"
)

// waitTimeout bounds every wait of TestManifestsRun; waits end as soon as
// what they wait for happens.
const waitTimeout = 30 * time.Second

// TestManifestsRun runs the coordinator and a renderer as their containers
// would run: the same arguments and environment, the example Secrets, with
// listen addresses moved to free loopback ports, Service addresses to the
// port they reach and volumes to temporary directories. It then checks
// what the kubelet and Prometheus would see.
func TestManifestsRun(t *testing.T) {
	t.Parallel()
	d := loadDeployment(t)
	if t.Failed() {
		t.FailNow()
	}
	l := &localizer{t: t, d: d, ports: map[int]string{}, mounts: map[string]string{}}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()

	l.start(d.coord, d.coordC)
	conn, err := grpc.NewClient(l.port(mustPort(t, d.coordCfg, "listen")), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatalf("health check of %q: %v", service, err)
		}
		return resp.GetStatus()
	}

	t.Run("Every gRPC probe of the coordinator answers SERVING", func(t *testing.T) {
		for name, p := range map[string]*probe{"startup": d.coordC.StartupProbe, "readiness": d.coordC.ReadinessProbe, "liveness": d.coordC.LivenessProbe} {
			if p == nil || p.GRPC == nil || p.GRPC.Service == nil {
				continue // TestManifests reports it
			}
			if got := check(*p.GRPC.Service); got != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("%s probe: health of %q = %v, want SERVING", name, *p.GRPC.Service, got)
			}
		}
	})

	l.start(d.rend, d.rendC)
	ps := d.principals(t)
	submitter, operator := principalWithRole(t, ps, "submitter"), principalWithRole(t, ps, "operator")
	// Clients reach the coordinator as the renderers do, through its Service.
	addr := l.value(d.rend, d.rendC, d.rendCfg["coordinator"].value)
	cli := func(token string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "leasehold"), args...)
		cmd.Env = append(testbin.Env(), "LEASEHOLD_ADDR="+addr, "LEASEHOLD_TOKEN="+token)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("leasehold %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	t.Run("A submitter of the example principals gets a document rendered by the renderer", func(t *testing.T) {
		doc := filepath.Join(t.TempDir(), "hello.txt")
		if err := os.WriteFile(doc, []byte("hello from the manifests\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out := cli(submitter.Token, "submit", "--team", submitter.Team, "--wait", doc)
		if !strings.Contains(out, "done: 1 succeeded, 0 failed, 0 cancelled") {
			t.Errorf("submit --wait printed:\n%s\nwant the document to succeed", out)
		}
	})

	t.Run("The renderer's HTTP probes answer 200 once it has worked", func(t *testing.T) {
		for name, p := range map[string]*probe{"readiness": d.rendC.ReadinessProbe, "liveness": d.rendC.LivenessProbe} {
			if p == nil || p.HTTPGet == nil {
				continue // TestManifests reports it
			}
			url := "http://" + l.port(d.rendC.containerPort(p.HTTPGet.Port)) + p.HTTPGet.Path
			if code, body := httpGet(t, url); code != http.StatusOK {
				t.Errorf("%s probe GET %s = %d %q, want 200", name, url, code, body)
			}
		}
	})

	t.Run("Readiness stays SERVING while an operator pauses dispatch", func(t *testing.T) {
		cli(operator.Token, "pause", "--reason", "checking the readiness probe")
		if got := check(dispatchHealthEntry); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("health of %s while paused = %v, want NOT_SERVING", dispatchHealthEntry, got)
		}
		if p := d.coordC.ReadinessProbe; p != nil && p.GRPC != nil && p.GRPC.Service != nil {
			if got := check(*p.GRPC.Service); got != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("readiness entry %q while paused = %v, want SERVING", *p.GRPC.Service, got)
			}
		}
		cli(operator.Token, "resume", "--reason", "checked")
	})

	t.Run("Every metric the Prometheus rules read is exported", func(t *testing.T) {
		exported := map[string]bool{}
		for _, w := range []*workload{d.coord, d.rend} {
			port, err := strconv.Atoi(w.Spec.Template.Metadata.Annotations["prometheus.io/port"])
			if err != nil {
				t.Fatalf("%s: prometheus.io/port: %v", w.Metadata.Name, err)
			}
			url := "http://" + l.port(port) + w.Spec.Template.Metadata.Annotations["prometheus.io/path"]
			code, body := httpGet(t, url)
			if code != http.StatusOK {
				t.Fatalf("GET %s = %d", url, code)
			}
			sc := bufio.NewScanner(strings.NewReader(body))
			for sc.Scan() {
				line := sc.Text()
				if line == "" || strings.HasPrefix(line, "#") {
					continue
				}
				name, _, _ := strings.Cut(line, "{")
				name, _, _ = strings.Cut(name, " ")
				exported[name] = true
			}
		}
		used := 0
		for _, g := range loadRules(t).Groups {
			for _, r := range g.Rules {
				for _, name := range metricNames(r.Expr) {
					used++
					if !exported[name] {
						t.Errorf("rule %s%s reads %s, which neither program exports", r.Record, r.Alert, name)
					}
				}
			}
		}
		if used == 0 {
			t.Error("the rules read no Leasehold metric")
		}
	})
}

// localizer maps the manifests' addresses and paths onto this machine.
type localizer struct {
	t      *testing.T
	d      *deployment
	ports  map[int]string    // container port -> free loopback address
	mounts map[string]string // workload/volume -> temporary directory
}

// port returns the loopback address standing for a container port.
func (l *localizer) port(n int) string {
	l.t.Helper()
	if a, ok := l.ports[n]; ok {
		return a
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		l.t.Fatal(err)
	}
	a := lis.Addr().String()
	lis.Close()
	l.ports[n] = a
	return a
}

// value maps one flag or variable value: a listen address or a Service
// address to its loopback address, a path on a volume to the volume's
// temporary directory; anything else is kept.
func (l *localizer) value(w *workload, c *container, v string) string {
	l.t.Helper()
	if host, port, err := splitHostPort(v); err == nil {
		switch host {
		case "", "0.0.0.0", "[::]", "127.0.0.1", "localhost":
			return l.port(port)
		}
		if target, err := l.d.serviceTarget(v); err == nil {
			return l.port(target)
		}
	}
	if strings.HasPrefix(v, "/") {
		if vol, rel, ok := w.mountOf(c, v); ok {
			return filepath.Join(l.mount(w, vol), rel)
		}
	}
	return v
}

// mount returns the temporary directory of a pod volume: empty for a
// claim, the example Secret's keys as files for a Secret.
func (l *localizer) mount(w *workload, vol string) string {
	l.t.Helper()
	key := w.Metadata.Name + "/" + vol
	if dir, ok := l.mounts[key]; ok {
		return dir
	}
	dir := l.t.TempDir()
	if name := w.secretVolume(vol); name != "" {
		s := l.d.secrets[name]
		if s == nil {
			l.t.Fatalf("%s: volume %s mounts Secret %s, which %s lacks", w.Metadata.Name, vol, name, exampleSecrets)
		}
		for k, v := range s.StringData {
			if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o400); err != nil {
				l.t.Fatal(err)
			}
		}
	} else if !w.claimVolume(vol) {
		l.t.Fatalf("%s: this test knows no volume %s; teach it", w.Metadata.Name, vol)
	}
	l.mounts[key] = dir
	return dir
}

// start runs a container's program with its arguments and environment
// mapped by value. The process is killed when the test ends, and its
// output logged if the test failed.
func (l *localizer) start(w *workload, c *container) {
	t := l.t
	t.Helper()
	var args []string
	for _, a := range c.Args {
		if name, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(a, "-") {
			args = append(args, name+"="+l.value(w, c, v))
		} else {
			args = append(args, l.value(w, c, a))
		}
	}
	env := testbin.Env()
	resolve := l.d.envResolver(w)
	for _, e := range c.Env {
		v, err := resolve(e)
		if err != nil {
			t.Fatalf("%s/%s: %s: %v", w.Metadata.Name, c.Name, e.Name, err)
		}
		env = append(env, e.Name+"="+l.value(w, c, v))
	}
	cmd := exec.Command(filepath.Join(binDir, filepath.Base(c.Command[0])), args...)
	cmd.Env = env
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", c.Name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s %s\n%s", c.Name, strings.Join(args, " "), out.String())
		}
	})
}

// httpGet returns the status and body of a GET.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: waitTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// syncBuffer is a bytes.Buffer safe for a process's two output streams.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
