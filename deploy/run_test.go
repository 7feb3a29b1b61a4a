package deploy

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/security"
	"github.com/leasehold/leasehold/internal/security/securitytest"
	"github.com/leasehold/leasehold/internal/stack"
	"github.com/leasehold/leasehold/internal/testbin"
)

// waitTimeout bounds each wait of TestManifestsRun; waits end as soon as
// what they wait for happens.
const waitTimeout = 30 * time.Second

// The test's pod network: a bridge in the test's own network namespace
// (the node's), which holds nodeIP, the address the kubelet, Prometheus
// and the test's clients come from, and one network namespace per pod
// plugged into it, with the pod's address (deployment.podIP) on its eth0.
// No address is a loopback one, so no rule that trusts loopback applies,
// as in a cluster.
var nodeIP = netip.MustParseAddr("10.244.0.1")

// podPrefixLen is the length of the pod network's prefix, 10.244.0.0/24.
const podPrefixLen = 24

// podNetworkEnv marks the copy of the test binary that runs inside the
// namespaces, and podExecEnv carries, to a copy that is to become a pod's
// program, the pod (podProgram as JSON).
const (
	podNetworkEnv = "LEASEHOLD_DEPLOY_POD_NETWORK"
	podExecEnv    = "LEASEHOLD_DEPLOY_POD_EXEC"
)

// TestManifestsRun runs the coordinator's StatefulSet and a renderer as
// their containers would run: each pod in a network namespace of its own
// with its own address, the containers' arguments and environment as
// Kubernetes gives them to each pod (the pod's name, its address), paths
// on volumes moved to temporary directories (one claim per pod; the
// example Secrets and ConfigMap, with a certificate made here as the
// README's Certificate describes it). The Services' and the pods' names
// resolve as the cluster DNS answers them (an /etc/hosts of its own), so
// that the voters find each other, and the renderer and the CLI the
// leader, by name as they would in the cluster. It then checks what the
// kubelet, Prometheus, a client and a peer would see, and stops and kills
// the leader while the renderer holds a lease. The one setting it adds is
// the mock renderer's render time (LEASEHOLD_LATENCY), so that a lease is
// held for a second while the leader goes.
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
	serving, peerSpec := d.readmeCertificates(t)
	joinPodNetwork(t, d)

	ca := securitytest.NewCA(t, "leasehold deploy test CA")
	r := newRun(t, d, ca, securitytest.NewCA(t, "leasehold deploy test peer CA"), serving, peerSpec)
	r.store = startArtifactStore(t, d)

	// The first voter alone: alive, not ready, as it waits for a second.
	first := d.coordPods[0]
	r.startCoordinator(first)
	t.Run("A voter alone is alive but not ready, and the StatefulSet still creates the others", func(t *testing.T) {
		if got := r.health(t, first, ""); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("the health of %s alone = %v, want NOT_SERVING: it knows no leader", first, got)
		}
		for name, p := range d.coordC.probes() {
			err := kubeletProbe(r.bounded(t), d.coordC, p, d.podIP(first))
			switch {
			case name == "readiness" && err == nil:
				t.Errorf("readiness of %s alone passes: a Service would route clients to a voter of no cluster", first)
			case name != "readiness" && err != nil:
				t.Errorf("%s probe of %s alone: %v; the kubelet would restart a voter for its peers' absence", name, first, err)
			}
		}
		if d.coord.Spec.PodManagementPolicy != "Parallel" {
			t.Fatalf("podManagementPolicy %q: the StatefulSet would wait for %s to be ready before it creates the next pod, which it never is alone",
				d.coord.Spec.PodManagementPolicy, first)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	for _, pod := range d.coordPods[1:] {
		r.startCoordinator(pod)
	}
	leader := r.leader(t, d.coordPods)
	t.Logf("%s leads", leader)

	t.Run("Every voter is ready and one leads; a follower names it", func(t *testing.T) {
		for _, pod := range d.coordPods {
			r.waitHealth(t, pod, "", healthpb.HealthCheckResponse_SERVING)
			want := healthpb.HealthCheckResponse_NOT_SERVING
			if pod == leader {
				want = healthpb.HealthCheckResponse_SERVING
			}
			if got := r.health(t, pod, leaderHealthEntry); got != want {
				t.Errorf("%s's %s = %v, want %v", pod, leaderHealthEntry, got, want)
			}
			for name, p := range d.coordC.probes() {
				if err := kubeletProbe(r.bounded(t), d.coordC, p, d.podIP(pod)); err != nil {
					t.Errorf("%s probe of %s: %v", name, pod, err)
				}
			}
		}
		// A write sent to a follower is refused, naming the leader's
		// address: what --grpc-advertise announces must reach it.
		lp, _ := d.peerOf(leader)
		for _, pod := range d.coordPods {
			if pod == leader {
				continue
			}
			operator := principalWithRole(t, d.principals(t), "operator")
			ctx := metadata.AppendToOutgoingContext(r.bounded(t), "authorization", "Bearer "+operator.Token)
			_, err := leaseholdv1.NewOperatorServiceClient(r.conn(t, pod)).PauseDispatch(ctx, &leaseholdv1.PauseDispatchRequest{Reason: "to a follower"})
			info := errorInfo(err)
			if status.Code(err) != codes.Unavailable || info.GetReason() != "NOT_LEADER" || info.GetMetadata()["leader_addr"] != lp.grpc {
				t.Errorf("a write to follower %s: %v %v, want UNAVAILABLE NOT_LEADER naming %s", pod, err, info.GetMetadata(), lp.grpc)
			}
		}
	})

	t.Run("Clients and peers verify the certificates under each name they use, and nothing is served in the clear", func(t *testing.T) {
		// The Service's names reach the pods' gRPC port; each pod's own
		// name its gRPC port, as --peers lists it.
		var addrs []string
		for _, name := range d.serviceDNSNames(t) {
			addrs = append(addrs, net.JoinHostPort(name, strconv.Itoa(mustPort(t, d.coordCfg, "listen"))))
		}
		for _, p := range d.peers {
			addrs = append(addrs, p.grpc)
		}
		for _, addr := range addrs {
			name, _, _ := net.SplitHostPort(addr)
			c, err := (&tls.Dialer{Config: &tls.Config{RootCAs: ca.Pool(), ServerName: name}}).DialContext(r.bounded(t), "tcp", addr)
			if err != nil {
				t.Errorf("TLS to %s, verifying %s: %v", addr, name, err)
				continue
			}
			c.Close()
		}
		// Each raft port, as --peers lists it, shows the peer certificate
		// naming its voter, under the peer CA.
		for _, p := range d.peers {
			c, err := (&tls.Dialer{Config: r.peerDial(p.id, &r.peerCert)}).DialContext(r.bounded(t), "tcp", p.raft)
			if err != nil {
				t.Errorf("TLS to the raft port %s, verifying %s under the peer CA: %v", p.raft, security.NodeURI(p.id), err)
				continue
			}
			c.Close()
		}
		// What a kubelet's grpc probe does: plaintext HTTP/2.
		plain, err := grpc.NewClient(r.podAddr(t, leader), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer plain.Close()
		if _, err := healthpb.NewHealthClient(plain).Check(r.bounded(t), &healthpb.HealthCheckRequest{}); err == nil {
			t.Error("a plaintext health check was answered; the coordinator must serve TLS only")
		}
		// The raft port shows its certificate to anyone, and talks only
		// to a peer that shows one the peer CA signed for a voter.
		lp, _ := d.peerOf(leader)
		raftHost, _, _ := net.SplitHostPort(lp.raft)
		stranger := securitytest.NewCA(t, "another CA")
		voter := []string{security.NodeURI(leader)}
		for what, cert := range map[string]*tls.Certificate{
			"no certificate": nil,
			"a certificate another CA made for a voter":      ptr(stranger.IssueWithURIs(t, both, voter, raftHost)),
			"a certificate the clients' CA made for a voter": ptr(ca.IssueWithURIs(t, both, voter, raftHost)),
			"a peer CA certificate for a voter's host only":  ptr(r.peerCA.IssueFor(t, both, raftHost)),
		} {
			c, err := (&tls.Dialer{Config: r.peerDial(leader, cert)}).DialContext(r.bounded(t), "tcp", lp.raft)
			if err != nil {
				t.Errorf("TLS to the raft port %s with %s: %v; want the handshake to verify the server, then a refusal", lp.raft, what, err)
				continue
			}
			// TLS 1.3: the server checks the client's certificate after
			// the client's side of the handshake; its refusal is the
			// first thing read.
			_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
			_, err = c.Read(make([]byte, 1))
			c.Close()
			if err == nil || !strings.Contains(err.Error(), "remote error: tls:") {
				t.Errorf("the raft port answered a peer with %s: %v", what, err)
			}
		}
	})

	// The one setting the test adds: the mock renderer takes a second per
	// document (its own --latency), so that a leader stopped while a
	// document renders is stopped while a lease is held.
	// The mock's previews are padded above the inline threshold, so that
	// they go to the shared store, from the renderer's pod, with presigned
	// URLs.
	rendPod := podNames(d.rend)[0]
	r.start(d.rend, d.rendC, rendPod, "LEASEHOLD_LATENCY="+renderTime.String(), "LEASEHOLD_PREVIEW_BYTES="+strconv.Itoa(previewBytes))
	ps := d.principals(t)
	submitter, operator := principalWithRole(t, ps, "submitter"), principalWithRole(t, ps, "operator")
	var acked []string // batches acknowledged, each of which must end succeeded

	t.Run("A submitter of the example principals gets a document rendered by the renderer, through the Service", func(t *testing.T) {
		acked = append(acked, r.submit(t, submitter, true, "hello"))
	})

	t.Run("The preview went to the shared artifact store, and downloads through the Service", func(t *testing.T) {
		if keys := r.store.objects(t); len(keys) != 1 || !strings.Contains(keys[0], "/sha256/") {
			t.Errorf("objects in %s: %q; want the one preview, under <team>/sha256/", r.store, keys)
		}
		out := r.mustCLI(t, submitter.Token, "artifact", "j-1", "-f", filepath.Join(t.TempDir(), "j-1.png"))
		if !strings.Contains(out, fmt.Sprintf("%d bytes", previewBytes)) {
			t.Errorf("leasehold artifact j-1: %q; want the %d bytes of the preview, verified", out, previewBytes)
		}
	})

	t.Run("The development tokens are refused", func(t *testing.T) {
		out, err := r.cli(t, "dev-operator", "audit")
		if err == nil || !strings.Contains(strings.ToLower(out), "unauthenticated") {
			t.Errorf("leasehold audit with dev-operator: %v\n%s\nwant UNAUTHENTICATED", err, out)
		}
	})

	t.Run("Every probe of the renderer passes as the kubelet asks it, once it has worked", func(t *testing.T) {
		for name, p := range d.rendC.probes() {
			if err := kubeletProbe(r.bounded(t), d.rendC, p, d.podIP(rendPod)); err != nil {
				t.Errorf("%s probe: %v", name, err)
			}
		}
	})

	t.Run("Readiness stays passing while an operator pauses dispatch", func(t *testing.T) {
		r.mustCLI(t, operator.Token, "pause", "--reason", "checking the readiness probe")
		// The leader of the moment: on a loaded machine leadership may
		// have moved since the first subtest, and a follower's writer
		// reports no dispatch switch.
		r.waitHealth(t, r.leader(t, d.coordPods), dispatchHealthEntry, healthpb.HealthCheckResponse_NOT_SERVING)
		for _, pod := range d.coordPods {
			if err := kubeletProbe(r.bounded(t), d.coordC, d.coordC.ReadinessProbe, d.podIP(pod)); err != nil {
				t.Errorf("readiness probe of %s while paused: %v", pod, err)
			}
		}
		r.mustCLI(t, operator.Token, "resume", "--reason", "checked")
	})

	t.Run("Prometheus scrapes every metric the rules read, verifying the coordinators' certificate", func(t *testing.T) {
		exported := map[string]bool{}
		scrape := func(w *workload, pod string) {
			a := w.Spec.Template.Metadata.Annotations
			port, err := strconv.Atoi(a["prometheus.io/port"])
			if err != nil {
				t.Fatalf("%s: prometheus.io/port: %v", w.Metadata.Name, err)
			}
			scheme := cmp.Or(a["prometheus.io/scheme"], "http")
			// The scrape job of deploy/README.md verifies the pods'
			// certificate under the Service's namespaced name.
			tlsCfg := &tls.Config{RootCAs: ca.Pool(), ServerName: d.scrapeServerName(t)}
			url := scheme + "://" + net.JoinHostPort(d.podIP(pod).String(), strconv.Itoa(port)) + a["prometheus.io/path"]
			code, body, err := httpGet(r.bounded(t), url, tlsCfg)
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
		// Every voter: the leader exports what only a leader knows.
		for _, pod := range d.coordPods {
			scrape(d.coord, pod)
		}
		scrape(d.rend, rendPod)
		used := 0
		for _, g := range loadRules(t).Groups {
			for _, rule := range g.Rules {
				for _, name := range metricNames(rule.Expr) {
					used++
					if !exported[name] {
						t.Errorf("rule %s%s reads %s, which no program exports", rule.Record, rule.Alert, name)
					}
				}
			}
		}
		if used == 0 {
			t.Error("the rules read no Leasehold metric")
		}
	})

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		name := map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGKILL: "SIGKILL"}[sig]
		t.Run("After a "+name+" of the leader another leads, the work goes on through the Service, and the pod comes back", func(t *testing.T) {
			old := r.leader(t, d.coordPods)
			rendering, job := r.rendering(t, old, submitter, operator, "rendering at the "+name)
			out, err := r.stop(old, sig)
			if sig == syscall.SIGTERM {
				if err != nil {
					t.Errorf("%s on SIGTERM: %v, want a clean exit within its grace period", old, err)
				}
				// The hand-over is the process's own (no preStop hook). A
				// transfer raft does not finish within an election timeout,
				// as on a loaded machine, falls back to an election, which
				// the next step waits for all the same.
				if !strings.Contains(out, "handed leadership over before stopping") && !strings.Contains(out, "handing leadership over before stopping") {
					t.Errorf("%s did not hand leadership over before stopping:\n%s", old, out)
				}
			}
			var rest []string
			for _, pod := range d.coordPods {
				if pod != old {
					rest = append(rest, pod)
				}
			}
			next := r.leader(t, rest)
			t.Logf("%s leads after the %s of %s", next, name, old)
			r.mustCLI(t, submitter.Token, "watch", rendering)
			// The renderer kept its lease across the failover: the job
			// ended in the attempt it was leased in.
			ctx := metadata.AppendToOutgoingContext(r.bounded(t), "authorization", "Bearer "+submitter.Token)
			resp, err := leaseholdv1.NewJobServiceClient(r.conn(t, next)).GetJob(ctx, &leaseholdv1.GetJobRequest{JobId: job})
			if err != nil || resp.GetJob().GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED || resp.GetJob().GetAttempt() != 1 {
				t.Errorf("job %s, leased when the leader was stopped: %v, %v; want SUCCEEDED in attempt 1", job, resp.GetJob(), err)
			}
			acked = append(acked, rendering, r.submit(t, submitter, true, "submitted after the "+name))

			// The StatefulSet makes the pod again, on its claim: it
			// rejoins, knows the leader and is ready.
			r.startCoordinator(old)
			r.waitHealth(t, old, "", healthpb.HealthCheckResponse_SERVING)
			if err := kubeletProbe(r.bounded(t), d.coordC, d.coordC.ReadinessProbe, d.podIP(old)); err != nil {
				t.Errorf("readiness of %s back on its claim: %v", old, err)
			}
		})
	}

	t.Run("Every batch acknowledged ended with its documents rendered", func(t *testing.T) {
		out := r.mustCLI(t, submitter.Token, "batches", "-o", "json")
		done := map[string]bool{}
		for line := range strings.Lines(out) {
			var b struct {
				ID       string `json:"id"`
				JobCount int    `json:"job_count"`
				Done     bool   `json:"done"`
				Counts   []struct {
					Phase string `json:"phase"`
					Count int    `json:"count"`
				} `json:"counts"`
			}
			if err := json.Unmarshal([]byte(line), &b); err != nil {
				t.Fatalf("leasehold batches -o json: %v\n%s", err, out)
			}
			succeeded := 0
			for _, c := range b.Counts {
				if c.Phase == "PHASE_SUCCEEDED" {
					succeeded += c.Count
				}
			}
			done[b.ID] = b.Done && b.JobCount > 0 && succeeded == b.JobCount
		}
		for _, id := range acked {
			if !done[id] {
				t.Errorf("batch %s was acknowledged but is not all succeeded:\n%s", id, out)
			}
		}
	})
}

// errorInfo returns the ErrorInfo of a gRPC error, or nil.
func errorInfo(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// runInPodNetwork runs TestManifestsRun again in a copy of the test binary
// inside namespaces of its own (see podNetworkCommand), and reports its
// result. It skips only when the namespaces cannot be had.
func runInPodNetwork(t *testing.T) {
	args := []string{"-test.run=^TestManifestsRun$", "-test.count=1", "-test.v=true"}
	if deadline, ok := t.Deadline(); ok {
		// The copy times out first, so that its goroutines are printed.
		args = append(args, "-test.timeout="+max(time.Until(deadline)-10*time.Second, time.Second).Round(time.Second).String())
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
		msg := fmt.Sprintf("running the manifests needs network and mount namespaces of its own, a bridge and veth pairs "+
			"(root, or unprivileged user namespaces), so that the Services' and pods' names resolve as in the cluster: %v", err)
		if os.Getenv(requireNamespacesEnv) != "" {
			t.Fatalf("%s (and %s is set)", msg, requireNamespacesEnv)
		}
		t.Skip(msg)
	}
	t.Fatal(err)
}

// joinPodNetwork sets up the namespaces this process runs in, the node's:
// the pod network's bridge, and the names the cluster DNS would answer.
// A headless Service's names resolve to its pods' addresses; the
// StatefulSet's pods' names under their governing Service resolve from
// the start only if it publishes pods that are not ready, as none is
// when they start. A Service with a cluster IP has no kube-proxy here and
// resolves to nothing.
func joinPodNetwork(t *testing.T, d *deployment) {
	t.Helper()
	var hosts strings.Builder
	hosts.WriteString("127.0.0.1 localhost\n::1 localhost\n")
	want := map[string][]netip.Addr{}
	for _, s := range d.services {
		if s.Spec.ClusterIP != "None" {
			continue
		}
		var pods []string
		for _, w := range d.workloads {
			if selects(s.Spec.Selector, w.Spec.Template.Metadata.Labels) {
				pods = append(pods, podNames(w)...)
			}
		}
		for _, pod := range pods {
			names := dnsForms(s.Metadata.Name, d.kust.Namespace)
			if s.Metadata.Name == d.coord.Spec.ServiceName && s.Spec.PublishNotReadyAddresses {
				names = append(names, dnsForms(pod+"."+s.Metadata.Name, d.kust.Namespace)...)
				for _, n := range dnsForms(pod+"."+s.Metadata.Name, d.kust.Namespace) {
					want[n] = []netip.Addr{d.podIP(pod)}
				}
			}
			fmt.Fprintf(&hosts, "%s %s\n", d.podIP(pod), strings.Join(names, " "))
		}
	}
	path := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(path, []byte(hosts.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := setUpNodeNetwork(path, netip.PrefixFrom(nodeIP, podPrefixLen)); err != nil {
		skipOrFail(t, err)
	}
	for name, addrs := range want {
		got, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip4", name)
		for i := range got {
			got[i] = got[i].Unmap()
		}
		if err != nil || !slices.Equal(got, addrs) {
			t.Fatalf("in the test's network, %s resolves to %v, %v; want %v", name, got, err, addrs)
		}
	}
}

// kubeletProbe asks a probe as the kubelet does: on the pod's IP, httpGet
// over HTTP or HTTPS (not verifying the certificate) passing on a status
// from 200 to 399, grpc in plaintext passing on SERVING.
func kubeletProbe(ctx context.Context, c *container, p *probe, podIP netip.Addr) error {
	switch {
	case p.HTTPGet != nil:
		port := c.containerPort(p.HTTPGet.Port)
		if port == 0 {
			return fmt.Errorf("port %v is not a port of container %s", p.HTTPGet.Port, c.Name)
		}
		scheme := cmp.Or(strings.ToLower(p.HTTPGet.Scheme), "http")
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

// run is one run of the manifests: the pods it started, their volumes,
// and the clients that reach them.
type run struct {
	t    *testing.T
	d    *deployment
	ca   *securitytest.CA
	cert tls.Certificate // the coordinators' certificate, from ca
	// peerCA signed peerCert, the voters' peer certificate.
	peerCA   *securitytest.CA
	peerCert tls.Certificate
	// issued are the certificates by the TLS Secret that holds them.
	issued map[string]issued
	mounts map[string]string // volume key -> temporary directory

	// ctx ends when a program exits that the test did not stop: every
	// wait then fails at once, with the program's output.
	ctx        context.Context
	exitCancel context.CancelFunc
	exitOnce   sync.Once
	exitMsg    string
	mu         sync.Mutex
	processes  map[string]*process // by pod
	// store is the S3-compatible bucket the coordinators share.
	store *artifactStore
}

// issued is a certificate and its key as a TLS Secret holds them, and
// the CA that signed it.
type issued struct {
	certPEM, keyPEM []byte
	ca              *securitytest.CA
}

// process is one pod's program.
type process struct {
	cmd *exec.Cmd
	out *syncBuffer
	// stopping is set before the test signals it.
	stopping atomic.Bool
	done     chan struct{}
	err      error // once done
}

// newRun issues the coordinators' certificate as the README's
// Certificate asks for it, from ca, and the peer certificate as its peer
// Certificate asks, from peerCA.
func newRun(t *testing.T, d *deployment, ca, peerCA *securitytest.CA, serving, peer certificateSpec) *run {
	t.Helper()
	if len(serving.DNSNames) == 0 || len(peer.URIs) == 0 {
		t.Fatal("the README's Certificate has no dnsNames, or its peer Certificate no uris")
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{t: t, d: d, ca: ca, peerCA: peerCA, cert: ca.IssueFor(t, usagesOf(t, serving), serving.DNSNames...),
		peerCert: peerCA.IssueWithURIs(t, usagesOf(t, peer), peer.URIs, peer.DNSNames...),
		issued:   map[string]issued{}, mounts: map[string]string{},
		ctx: ctx, exitCancel: cancel, processes: map[string]*process{}}
	for _, i := range []struct {
		secret string
		cert   tls.Certificate
		ca     *securitytest.CA
	}{{serving.SecretName, r.cert, ca}, {peer.SecretName, r.peerCert, peerCA}} {
		certPEM, keyPEM := securitytest.KeyPairPEM(t, i.cert)
		r.issued[i.secret] = issued{certPEM: certPEM, keyPEM: keyPEM, ca: i.ca}
	}
	t.Cleanup(func() {
		cancel()
		r.mu.Lock()
		defer r.mu.Unlock()
		for pod, p := range r.processes {
			p.stopping.Store(true)
			_ = p.cmd.Process.Kill()
			<-p.done
			if t.Failed() {
				t.Logf("%s %s\n%s", pod, strings.Join(p.cmd.Args, " "), p.out.String())
			}
		}
	})
	return r
}

// usagesOf returns the extended key usages a README Certificate asks for.
func usagesOf(t *testing.T, spec certificateSpec) []x509.ExtKeyUsage {
	t.Helper()
	var usages []x509.ExtKeyUsage
	for _, u := range spec.Usages {
		switch u {
		case "server auth":
			usages = append(usages, x509.ExtKeyUsageServerAuth)
		case "client auth":
			usages = append(usages, x509.ExtKeyUsageClientAuth)
		case "digital signature", "key encipherment":
			// Key usages, which the issued certificate carries anyway.
		default:
			t.Fatalf("the README's Certificate has usage %q, which this test cannot issue; teach it", u)
		}
	}
	return usages
}

// peerDial is the TLS of a peer dialling voter id's raft port, presenting
// cert (none when nil): the server must chain to the peer CA and name id.
func (r *run) peerDial(id string, cert *tls.Certificate) *tls.Config {
	cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12, //nolint:gosec // VerifyConnection verifies
		VerifyConnection: func(cs tls.ConnectionState) error {
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: r.peerCA.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return err
			}
			if !slices.Contains(security.NodeIDs(leaf), id) {
				return fmt.Errorf("the raft port's certificate names %q, not %s", security.NodeIDs(leaf), id)
			}
			return nil
		}}
	if cert != nil {
		// Presented whatever CAs the server asks for, as an attacker would.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return cfg
}

// both are the extended key usages of a peer certificate.
var both = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}

func ptr[T any](v T) *T { return &v }

// value maps one flag or variable value of pod's container: a path on a
// volume to the volume's temporary directory; anything else, addresses
// included, is kept.
func (r *run) value(w *workload, c *container, pod, v string) string {
	r.t.Helper()
	if strings.HasPrefix(v, "/") {
		if vol, rel, ok := w.mountOf(c, v); ok {
			return filepath.Join(r.mount(w, pod, vol), rel)
		}
	}
	return v
}

// mount returns the temporary directory of a pod volume: empty for a
// claim, the pod's own, which outlives the pod as a claim does; a
// Secret's or a ConfigMap's keys as files. A TLS Secret holds the
// certificate made here for it, and a ca.crt key the certificate of the CA
// that signed it (the peer CA in the ConfigMap of --tls-peer-ca): the
// examples hold placeholders.
func (r *run) mount(w *workload, pod, vol string) string {
	r.t.Helper()
	key := w.Metadata.Name + "/" + vol
	if w.claimVolume(vol) {
		key = pod + "/" + vol
	}
	if dir, ok := r.mounts[key]; ok {
		return dir
	}
	dir := r.t.TempDir()
	files := map[string]string{}
	caPEM := r.ca.PEM() // the CA of a ca.crt key: the peer CA's where the volume is the peers'
	switch {
	case w.secretVolume(vol) != "":
		name := w.secretVolume(vol)
		s := r.d.secrets[name]
		if s == nil {
			r.t.Fatalf("%s: volume %s mounts Secret %s, which %s lacks", w.Metadata.Name, vol, name, exampleSecrets)
		}
		for k, v := range s.StringData {
			files[k] = v
		}
		if s.Type == tlsSecretType {
			is, ok := r.issued[name]
			if !ok {
				r.t.Fatalf("%s: TLS Secret %s is no Secret of the README's Certificates", w.Metadata.Name, name)
			}
			files["tls.crt"], files["tls.key"] = string(is.certPEM), string(is.keyPEM)
			caPEM = is.ca.PEM()
		}
	case w.configMapVolume(vol) != "":
		name := w.configMapVolume(vol)
		cm := r.d.configMaps[name]
		if cm == nil {
			r.t.Fatalf("%s: volume %s mounts ConfigMap %s, which %s lacks", w.Metadata.Name, vol, name, exampleSecrets)
		}
		for k, v := range cm.Data {
			files[k] = v
		}
		if name == r.d.configMapOf(r.t, r.d.coord, r.d.coordC, r.d.coordCfg, "tls-peer-ca") {
			caPEM = r.peerCA.PEM()
		}
	case !w.claimVolume(vol):
		r.t.Fatalf("%s: this test knows no volume %s; teach it", w.Metadata.Name, vol)
	}
	if _, ok := files[caKey]; ok {
		files[caKey] = string(caPEM)
	}
	for k, v := range files {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o400); err != nil {
			r.t.Fatal(err)
		}
	}
	r.mounts[key] = dir
	return dir
}

// startCoordinator starts one pod of the coordinator's StatefulSet.
// The example Secret names a bucket on AWS; the test's store stands in for
// it, reached with the same keys.
func (r *run) startCoordinator(pod string) { r.start(r.d.coord, r.d.coordC, pod, r.store.env) }

// start runs pod's container in a network namespace of its own, with the
// pod's address, its arguments and environment as Kubernetes gives them
// to that pod (and the variables extra), and paths mapped by value. If
// the program exits before the test stops it, r.ctx ends.
func (r *run) start(w *workload, c *container, pod string, extra ...string) {
	t := r.t
	t.Helper()
	env, errs := containerEnv(c, r.d.envResolver(pod))
	for _, err := range errs {
		t.Fatalf("%s: %v", pod, err)
	}
	var args []string
	for _, a := range containerArgs(c, env) {
		if name, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(a, "-") {
			args = append(args, name+"="+r.value(w, c, pod, v))
		} else {
			args = append(args, r.value(w, c, pod, a))
		}
	}
	environ := testbin.Env()
	for _, e := range env {
		environ = append(environ, e.name+"="+r.value(w, c, pod, e.value))
	}
	// A variable of extra replaces the container's: the environment of
	// an exec keeps the first of two.
	for _, e := range extra {
		name, _, _ := strings.Cut(e, "=")
		environ = slices.DeleteFunc(environ, func(v string) bool { return strings.HasPrefix(v, name+"=") })
	}
	environ = append(environ, extra...)
	p := &process{out: &syncBuffer{}, done: make(chan struct{})}
	cmd, err := startInPod(filepath.Join(binDir, filepath.Base(c.Command[0])), args, environ,
		netip.PrefixFrom(r.d.podIP(pod), podPrefixLen), p.out)
	if err != nil {
		if namespacesUnavailable(err) {
			skipOrFail(t, err)
		}
		t.Fatalf("starting %s: %v", pod, err)
	}
	p.cmd = cmd
	go func() {
		p.err = cmd.Wait()
		close(p.done)
		if !p.stopping.Load() {
			r.exitOnce.Do(func() {
				r.exitMsg = fmt.Sprintf("%s exited (%v):\n%s", pod, p.err, p.out.String())
				r.exitCancel()
			})
		}
	}()
	r.mu.Lock()
	r.processes[pod] = p
	r.mu.Unlock()
}

// stop sends sig to pod's program, as the kubelet does, and returns how
// it exited and what it printed.
func (r *run) stop(pod string, sig syscall.Signal) (string, error) {
	r.t.Helper()
	r.mu.Lock()
	p := r.processes[pod]
	delete(r.processes, pod)
	r.mu.Unlock()
	p.stopping.Store(true)
	if err := p.cmd.Process.Signal(sig); err != nil {
		r.t.Fatalf("%v to %s: %v", sig, pod, err)
	}
	ctx, cancel := r.wait()
	defer cancel()
	select {
	case <-p.done:
	case <-ctx.Done():
		r.t.Fatalf("waiting for %s to exit on %v: %v%s", pod, sig, ctx.Err(), r.exitNote())
	}
	return p.out.String(), p.err
}

// exitNote says which program exited, if one did, for a failed wait.
func (r *run) exitNote() string {
	// exitMsg is written before r.ctx is cancelled.
	if r.ctx.Err() != nil && r.exitMsg != "" {
		return "\n" + r.exitMsg
	}
	return ""
}

// wait returns a context for one wait.
func (r *run) wait() (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.ctx, waitTimeout)
}

// bounded returns a context for the waits of one step of t.
func (r *run) bounded(t *testing.T) context.Context {
	ctx, cancel := r.wait()
	t.Cleanup(cancel)
	return ctx
}

// podAddr returns pod's gRPC address in --peers, by its name.
func (r *run) podAddr(t *testing.T, pod string) string {
	t.Helper()
	p, ok := r.d.peerOf(pod)
	if !ok || p.grpc == "" {
		t.Fatalf("--peers names no gRPC address of %s", pod)
	}
	return p.grpc
}

// conn returns a new connection to pod by its gRPC address in --peers,
// over TLS verifying that name, as a follower's client would reach the
// leader it names.
func (r *run) conn(t *testing.T, pod string) *grpc.ClientConn {
	t.Helper()
	addr := r.podAddr(t, pod)
	host, _, _ := net.SplitHostPort(addr)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: r.ca.Pool(), ServerName: host})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// health returns pod's health entry service, once it answers.
func (r *run) health(t *testing.T, pod, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := r.wait()
	defer cancel()
	resp, err := healthpb.NewHealthClient(r.conn(t, pod)).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("health of %q on %s: %v%s", service, pod, err, r.exitNote())
	}
	return resp.GetStatus()
}

// waitHealth waits until pod reports want for service.
func (r *run) waitHealth(t *testing.T, pod, service string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	ctx, cancel := r.wait()
	defer cancel()
	if err := watchFor(ctx, r.conn(t, pod), service, want); err != nil {
		t.Fatalf("waiting for %s's %q to be %v: %v%s", pod, service, want, err, r.exitNote())
	}
}

// watchFor watches a health entry until it reports want.
func watchFor(ctx context.Context, conn *grpc.ClientConn, service string, want healthpb.HealthCheckResponse_ServingStatus) error {
	return stack.WatchHealth(ctx, healthpb.NewHealthClient(conn), service, want)
}

// leader waits until one of pods reports the Leader entry SERVING, and
// returns it.
func (r *run) leader(t *testing.T, pods []string) string {
	t.Helper()
	ctx, cancel := r.wait()
	defer cancel()
	type result struct {
		pod string
		err error
	}
	results := make(chan result, len(pods))
	for _, pod := range pods {
		conn := r.conn(t, pod)
		go func() {
			results <- result{pod, watchFor(ctx, conn, leaderHealthEntry, healthpb.HealthCheckResponse_SERVING)}
		}()
	}
	var errs []error
	for range pods {
		res := <-results
		if res.err == nil {
			return res.pod
		}
		errs = append(errs, fmt.Errorf("%s: %w", res.pod, res.err))
	}
	t.Fatalf("no leader among %v: %v%s", pods, errors.Join(errs...), r.exitNote())
	return ""
}

// renderTime is how long the renderer takes per document in the run.
const renderTime = time.Second

// previewBytes is the size of the renderer's previews in the run: above
// the coordinators' inline threshold.
const previewBytes = 65536

// rendering submits one document as p with dispatch paused by operator,
// watches its batch on the leader, resumes dispatch and returns once the
// job is leased: the renderer then renders it for renderTime. It returns
// the batch and the job.
func (r *run) rendering(t *testing.T, leader string, p, operator principal, text string) (string, string) {
	t.Helper()
	r.mustCLI(t, operator.Token, "pause", "--reason", "so that the watch sees the lease")
	batch := r.submit(t, p, false, text)
	ctx, cancel := r.wait()
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+p.Token)
	w, err := leaseholdv1.NewJobServiceClient(r.conn(t, leader)).WatchBatch(ctx, &leaseholdv1.WatchBatchRequest{BatchId: batch})
	if err != nil {
		t.Fatalf("watching batch %s on %s: %v", batch, leader, err)
	}
	if _, err := w.Recv(); err != nil { // the opening snapshot of its one job
		t.Fatalf("watching batch %s on %s: %v", batch, leader, err)
	}
	r.mustCLI(t, operator.Token, "resume", "--reason", "watching")
	for {
		ev, err := w.Recv()
		if err != nil {
			t.Fatalf("waiting for batch %s's job to be leased: %v%s", batch, err, r.exitNote())
		}
		switch ev.GetPhase() {
		case leaseholdv1.Phase_PHASE_LEASED:
			return batch, ev.GetJobId()
		case leaseholdv1.Phase_PHASE_QUEUED:
		default:
			t.Fatalf("batch %s's job went %v before it was leased", batch, ev.GetPhase())
		}
	}
}

// cli runs the leasehold CLI with token, reaching the coordinators as the
// renderers do: their address (the Service, by name), verified with the
// CA the renderers mount.
func (r *run) cli(t *testing.T, token string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := r.wait()
	defer cancel()
	d := r.d
	caFile := r.value(d.rend, d.rendC, podNames(d.rend)[0], d.rendCfg["tls-ca"].value)
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "leasehold"), args...)
	cmd.Env = append(testbin.Env(), "LEASEHOLD_ADDR="+d.rendCfg["coordinator"].value, "LEASEHOLD_TLS_CA="+caFile, "LEASEHOLD_TOKEN="+token)
	out, err := cmd.CombinedOutput()
	if err != nil {
		err = fmt.Errorf("leasehold %s: %v%s", strings.Join(args, " "), err, r.exitNote())
	}
	return string(out), err
}

func (r *run) mustCLI(t *testing.T, token string, args ...string) string {
	t.Helper()
	out, err := r.cli(t, token, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return out
}

// batchLine is what leasehold submit prints for each batch acknowledged.
var batchLine = regexp.MustCompile(`(?m)^batch (\S+): `)

// submit submits one document as p, waiting for it to be rendered or
// not, and returns the batch id acknowledged.
func (r *run) submit(t *testing.T, p principal, wait bool, text string) string {
	t.Helper()
	doc := filepath.Join(t.TempDir(), "doc.txt")
	if err := os.WriteFile(doc, []byte(text+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"submit", "--team", p.Team, doc}
	if wait {
		args = append(args, "--wait")
	}
	out := r.mustCLI(t, p.Token, args...)
	if wait && !strings.Contains(out, "done: 1 succeeded, 0 failed, 0 cancelled") {
		t.Errorf("submit --wait printed:\n%s\nwant the document to succeed", out)
	}
	m := batchLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("submit printed no batch id:\n%s", out)
	}
	return m[1]
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
