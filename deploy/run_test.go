package deploy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/internal/security/securitytest"
	"github.com/leasehold/leasehold/internal/testbin"
)

// waitTimeout bounds every wait of TestManifestsRun; waits end as soon as
// what they wait for happens.
const waitTimeout = 30 * time.Second

// The test's pod network, inside a network namespace of its own: the
// Service's cluster IP, which the Service's DNS names resolve to, and the
// pods' IP, which the kubelet probes and Prometheus scrapes. Both sit on
// the namespace's loopback device, and neither is a loopback address, so
// no rule that trusts loopback applies, as in a cluster.
var (
	serviceIP = netip.MustParseAddr("10.96.0.10")
	podIP     = netip.MustParseAddr("10.244.0.10")
)

// podNetworkEnv marks the copy of the test binary that runs inside the
// namespaces.
const podNetworkEnv = "LEASEHOLD_DEPLOY_POD_NETWORK"

// TestManifestsRun runs the coordinator and a renderer as their containers
// would run: the same arguments and environment, unchanged but for paths
// on volumes (moved to temporary directories holding the example Secrets
// and ConfigMap, and a certificate made here for the Service's DNS
// names). It runs in a network and mount namespace of its own, where the
// Service's names resolve (an /etc/hosts of its own) to an address on
// which the Service's ports reach the pods' listeners, so that the
// renderer and the CLI dial the Service by name as they would in the
// cluster. It then checks what the kubelet, Prometheus and a client would
// see.
func TestManifestsRun(t *testing.T) {
	if os.Getenv(podNetworkEnv) == "" {
		t.Parallel()
		runInPodNetwork(t)
		return
	}
	d := loadDeployment(t)
	if t.Failed() {
		t.FailNow()
	}
	names := d.serviceDNSNames(t)
	joinPodNetwork(t, d, names)

	ca := securitytest.NewCA(t, "leasehold deploy test CA")
	l := &localizer{t: t, d: d, ca: ca, certNames: names, mounts: map[string]string{}, exited: make(chan struct{})}
	// Every wait ends when a program exits: a manifest whose program
	// cannot start fails at once, with the program's output.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	go func() {
		select {
		case <-l.exited:
			cancel()
		case <-ctx.Done():
		}
	}()

	// The renderers' address of the coordinator: the Service, by name.
	coordAddr := d.rendCfg["coordinator"].value
	l.start(d.coord, d.coordC)
	conn, err := grpc.NewClient(coordAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool()})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	check := func(t *testing.T, service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatalf("health check of %q at %s over TLS: %v%s", service, coordAddr, err, l.exitNote())
		}
		return resp.GetStatus()
	}
	if got := check(t, ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("coordinator health = %v, want SERVING", got)
	}

	t.Run("The coordinator serves TLS only, under a certificate for each of the Service's names", func(t *testing.T) {
		_, port, _ := net.SplitHostPort(coordAddr)
		for _, name := range names {
			c, err := tls.Dial("tcp", net.JoinHostPort(name, port), &tls.Config{RootCAs: ca.Pool(), ServerName: name})
			if err != nil {
				t.Errorf("TLS to %s:%s, verifying %s: %v", name, port, name, err)
				continue
			}
			c.Close()
		}
		// What a kubelet's grpc probe does: plaintext HTTP/2.
		plain, err := grpc.NewClient(coordAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer plain.Close()
		if _, err := healthpb.NewHealthClient(plain).Check(ctx, &healthpb.HealthCheckRequest{}); err == nil {
			t.Error("a plaintext health check was answered; the coordinator must serve TLS only")
		}
	})

	t.Run("Every probe of the coordinator passes as the kubelet asks it", func(t *testing.T) {
		for name, p := range d.coordC.probes() {
			if err := kubeletProbe(ctx, d.coordC, p); err != nil {
				t.Errorf("%s probe: %v", name, err)
			}
		}
	})

	l.start(d.rend, d.rendC)
	ps := d.principals(t)
	submitter, operator := principalWithRole(t, ps, "submitter"), principalWithRole(t, ps, "operator")
	// Clients reach the coordinator as the renderers do: the Service by
	// name, verified with the CA the renderers mount.
	caFile := l.value(d.rend, d.rendC, d.rendCfg["tls-ca"].value)
	cli := func(token string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "leasehold"), args...)
		cmd.Env = append(testbin.Env(), "LEASEHOLD_ADDR="+coordAddr, "LEASEHOLD_TLS_CA="+caFile, "LEASEHOLD_TOKEN="+token)
		out, err := cmd.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("leasehold %s: %v%s", strings.Join(args, " "), err, l.exitNote())
		}
		return string(out), err
	}
	mustCLI := func(t *testing.T, token string, args ...string) string {
		t.Helper()
		out, err := cli(token, args...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return out
	}

	t.Run("A submitter of the example principals gets a document rendered by the renderer", func(t *testing.T) {
		doc := filepath.Join(t.TempDir(), "hello.txt")
		if err := os.WriteFile(doc, []byte("hello from the manifests\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out := mustCLI(t, submitter.Token, "submit", "--team", submitter.Team, "--wait", doc)
		if !strings.Contains(out, "done: 1 succeeded, 0 failed, 0 cancelled") {
			t.Errorf("submit --wait printed:\n%s\nwant the document to succeed", out)
		}
	})

	t.Run("The development tokens are refused", func(t *testing.T) {
		out, err := cli("dev-operator", "audit")
		if err == nil || !strings.Contains(strings.ToLower(out), "unauthenticated") {
			t.Errorf("leasehold audit with dev-operator: %v\n%s\nwant UNAUTHENTICATED", err, out)
		}
	})

	t.Run("Every probe of the renderer passes as the kubelet asks it, once it has worked", func(t *testing.T) {
		for name, p := range d.rendC.probes() {
			if err := kubeletProbe(ctx, d.rendC, p); err != nil {
				t.Errorf("%s probe: %v", name, err)
			}
		}
	})

	t.Run("Readiness stays passing while an operator pauses dispatch", func(t *testing.T) {
		mustCLI(t, operator.Token, "pause", "--reason", "checking the readiness probe")
		if got := check(t, dispatchHealthEntry); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("health of %s while paused = %v, want NOT_SERVING", dispatchHealthEntry, got)
		}
		if p := d.coordC.ReadinessProbe; p != nil {
			if err := kubeletProbe(ctx, d.coordC, p); err != nil {
				t.Errorf("readiness probe while paused: %v", err)
			}
		}
		mustCLI(t, operator.Token, "resume", "--reason", "checked")
	})

	t.Run("Prometheus scrapes every metric the rules read, verifying the coordinator's certificate", func(t *testing.T) {
		exported := map[string]bool{}
		for _, w := range []*workload{d.coord, d.rend} {
			a := w.Spec.Template.Metadata.Annotations
			port, err := strconv.Atoi(a["prometheus.io/port"])
			if err != nil {
				t.Fatalf("%s: prometheus.io/port: %v", w.Metadata.Name, err)
			}
			scheme := a["prometheus.io/scheme"]
			if scheme == "" {
				scheme = "http"
			}
			// The scrape job of deploy/README.md verifies the pods'
			// certificate under the Service's namespaced name.
			tlsCfg := &tls.Config{RootCAs: ca.Pool(), ServerName: d.scrapeServerName(t)}
			url := scheme + "://" + net.JoinHostPort(podIP.String(), strconv.Itoa(port)) + a["prometheus.io/path"]
			code, body, err := httpGet(ctx, url, tlsCfg)
			if err != nil || code != http.StatusOK {
				t.Fatalf("GET %s = %d, %v", url, code, err)
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
					// A replicated coordinator alone exports these, the
					// per-follower ones on its leader only; the cluster
					// tests of package coordinator scrape them from one.
					if strings.HasPrefix(name, "leasehold_raft_") {
						continue
					}
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

// runInPodNetwork runs TestManifestsRun again in a copy of the test binary
// inside namespaces of its own (see podNetworkCommand), and reports its
// result. It skips only when the namespaces cannot be had.
func runInPodNetwork(t *testing.T) {
	args := []string{"-test.run=^TestManifestsRun$", "-test.count=1", "-test.v=true"}
	if deadline, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(deadline).Round(time.Second).String())
	}
	cmd, err := podNetworkCommand(args...)
	if err != nil {
		skipOrFail(t, err)
	}
	cmd.Env = append(os.Environ(), podNetworkEnv+"=1", "LEASEHOLD_BIN="+binDir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		skipOrFail(t, err)
	}
	err = cmd.Wait()
	switch text := out.String(); {
	case err != nil:
		t.Fatalf("in its own network namespace: %v\n%s", err, text)
	case strings.Contains(text, "--- SKIP: TestManifestsRun "):
		t.Skipf("in its own network namespace:\n%s", text)
	case !strings.Contains(text, "--- PASS: TestManifestsRun "):
		t.Fatalf("in its own network namespace, the test did not pass:\n%s", text)
	case testing.Verbose():
		t.Logf("in its own network namespace:\n%s", text)
	}
}

// requireNamespacesEnv, when set (as CI sets it: .ci/run), turns the skip
// for want of namespaces into a failure.
const requireNamespacesEnv = "LEASEHOLD_REQUIRE_NAMESPACES"

// skipOrFail skips the test when err says that the namespaces cannot be
// had here, unless requireNamespacesEnv is set, and fails it otherwise.
func skipOrFail(t *testing.T, err error) {
	t.Helper()
	if namespacesUnavailable(err) {
		msg := fmt.Sprintf("running the manifests needs a network and a mount namespace of its own "+
			"(root, or unprivileged user namespaces), so that the Service's name resolves as in the cluster: %v", err)
		if os.Getenv(requireNamespacesEnv) != "" {
			t.Fatalf("%s (and %s is set)", msg, requireNamespacesEnv)
		}
		t.Skip(msg)
	}
	t.Fatal(err)
}

// joinPodNetwork sets up the namespaces this process runs in: the
// Service's DNS names resolve to serviceIP, and serviceIP and podIP are
// addresses of this network.
func joinPodNetwork(t *testing.T, d *deployment, names []string) {
	t.Helper()
	for _, s := range d.services {
		for _, p := range s.Spec.Ports {
			// No kube-proxy here: a Service port reaches its pods only on
			// the same port number.
			if target, err := d.serviceTarget(s.Metadata.Name + ":" + strconv.Itoa(p.Port)); err == nil && target != p.Port {
				t.Fatalf("Service %s maps port %d to %d; this test reaches pods on the Service's port numbers: teach it", s.Metadata.Name, p.Port, target)
			}
		}
	}
	hosts := filepath.Join(t.TempDir(), "hosts")
	content := "127.0.0.1 localhost\n::1 localhost\n" + serviceIP.String() + " " + strings.Join(names, " ") + "\n"
	if err := os.WriteFile(hosts, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := setUpPodNetwork(hosts, serviceIP, podIP); err != nil {
		skipOrFail(t, err)
	}
	for _, name := range names {
		addrs, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip4", name)
		if err != nil || len(addrs) != 1 || addrs[0].Unmap() != serviceIP {
			t.Fatalf("in the test's network, %s resolves to %v, %v; want %s", name, addrs, err, serviceIP)
		}
	}
}

// kubeletProbe asks a probe as the kubelet does: on the pod's IP, httpGet
// over HTTP or HTTPS (not verifying the certificate) passing on a status
// from 200 to 399, grpc in plaintext passing on SERVING.
func kubeletProbe(ctx context.Context, c *container, p *probe) error {
	switch {
	case p.HTTPGet != nil:
		port := c.containerPort(p.HTTPGet.Port)
		if port == 0 {
			return fmt.Errorf("port %v is not a port of container %s", p.HTTPGet.Port, c.Name)
		}
		scheme := strings.ToLower(p.HTTPGet.Scheme)
		if scheme == "" {
			scheme = "http"
		}
		url := scheme + "://" + net.JoinHostPort(podIP.String(), strconv.Itoa(port)) + p.HTTPGet.Path
		code, body, err := httpGet(ctx, url, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			return err
		}
		if code < 200 || code >= 400 {
			return fmt.Errorf("GET %s = %d %q", url, code, body)
		}
		return nil
	case p.GRPC != nil:
		conn, err := grpc.NewClient(net.JoinHostPort(podIP.String(), strconv.Itoa(p.GRPC.Port)), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		var service string
		if p.GRPC.Service != nil {
			service = *p.GRPC.Service
		}
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			return fmt.Errorf("grpc probe of %q on port %d (plaintext, as the kubelet's): %v", service, p.GRPC.Port, err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("grpc probe of %q on port %d: %v", service, p.GRPC.Port, resp.GetStatus())
		}
		return nil
	}
	return fmt.Errorf("this test cannot ask the probe %+v; teach it", p)
}

// localizer maps the manifests' paths onto this machine and runs their
// programs.
type localizer struct {
	t         *testing.T
	d         *deployment
	ca        *securitytest.CA
	certNames []string          // the DNS names of certificates it makes
	mounts    map[string]string // workload/volume -> temporary directory

	exitOnce sync.Once
	exited   chan struct{} // closed when a program it started exits
	exitMsg  string        // which, and how
}

// value maps one flag or variable value: a path on a volume to the
// volume's temporary directory; anything else, addresses included, is
// kept.
func (l *localizer) value(w *workload, c *container, v string) string {
	l.t.Helper()
	if strings.HasPrefix(v, "/") {
		if vol, rel, ok := w.mountOf(c, v); ok {
			return filepath.Join(l.mount(w, vol), rel)
		}
	}
	return v
}

// mount returns the temporary directory of a pod volume: empty for a
// claim, a Secret's or a ConfigMap's keys as files. A TLS Secret holds a
// certificate for the Service's names made here, and a ca.crt key the
// certificate of the CA that signed it: the examples hold placeholders.
func (l *localizer) mount(w *workload, vol string) string {
	l.t.Helper()
	key := w.Metadata.Name + "/" + vol
	if dir, ok := l.mounts[key]; ok {
		return dir
	}
	dir := l.t.TempDir()
	files := map[string]string{}
	switch {
	case w.secretVolume(vol) != "":
		name := w.secretVolume(vol)
		s := l.d.secrets[name]
		if s == nil {
			l.t.Fatalf("%s: volume %s mounts Secret %s, which %s lacks", w.Metadata.Name, vol, name, exampleSecrets)
		}
		for k, v := range s.StringData {
			files[k] = v
		}
		if s.Type == tlsSecretType {
			certPEM, keyPEM := securitytest.KeyPairPEM(l.t, l.ca.ServerFor(l.t, l.certNames...))
			files["tls.crt"], files["tls.key"] = string(certPEM), string(keyPEM)
		}
	case w.configMapVolume(vol) != "":
		name := w.configMapVolume(vol)
		cm := l.d.configMaps[name]
		if cm == nil {
			l.t.Fatalf("%s: volume %s mounts ConfigMap %s, which %s lacks", w.Metadata.Name, vol, name, exampleSecrets)
		}
		for k, v := range cm.Data {
			files[k] = v
		}
	case !w.claimVolume(vol):
		l.t.Fatalf("%s: this test knows no volume %s; teach it", w.Metadata.Name, vol)
	}
	if _, ok := files[caKey]; ok {
		files[caKey] = string(l.ca.PEM())
	}
	for k, v := range files {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o400); err != nil {
			l.t.Fatal(err)
		}
	}
	l.mounts[key] = dir
	return dir
}

// start runs a container's program with its arguments and environment
// mapped by value. The process is killed when the test ends, and its
// output logged if the test failed. If it exits first, l.exited closes.
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
	waited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		close(waited)
		l.exitOnce.Do(func() {
			l.exitMsg = fmt.Sprintf("%s exited (%v):\n%s", c.Name, err, out.String())
			close(l.exited)
		})
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-waited
		if t.Failed() {
			t.Logf("%s %s\n%s", c.Name, strings.Join(args, " "), out.String())
		}
	})
}

// exitNote says which program exited, if one did, for a failed wait.
func (l *localizer) exitNote() string {
	select {
	case <-l.exited:
		return "\n" + l.exitMsg
	default:
		return ""
	}
}

// httpGet returns the status and body of a GET, over TLS with tlsCfg for
// an https URL.
func httpGet(ctx context.Context, url string, tlsCfg *tls.Config) (int, string, error) {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: tlsCfg}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
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
