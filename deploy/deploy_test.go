// Package deploy holds no code: its tests check the deployment files
// beside them against the programs they deploy. The Kubernetes manifests
// are decoded strictly and every flag and LEASEHOLD_* variable they set
// must be one that the built binaries' --help lists; ports, probes, grace
// periods, Secrets, TLS, the cluster's peers and the image must agree with
// each other; and the three coordinators and a renderer are run with the
// manifests' own configuration (volumes moved to temporary directories,
// the values Kubernetes gives each pod substituted, addresses kept: each
// pod runs in a network namespace of its own where the Services' and the
// pods' names resolve) to show that the voters elect a leader over mutual
// TLS, that the renderer reaches it through the Service and keeps
// rendering when the leader is stopped or killed, that the probes pass as
// the kubelet asks them and that every metric the Prometheus rules use
// exists.
package deploy

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/leaderdial"
	"github.com/leasehold/leasehold/internal/security"
	"github.com/leasehold/leasehold/internal/testbin"
)

// binDir holds the binaries under test (see package testbin).
var binDir string

// moduleRoot is the repository root.
var moduleRoot string

func TestMain(m *testing.M) {
	// A pod's process first: a copy of this binary that sets up the pod's
	// network namespace and becomes the pod's program (run_test.go).
	if spec := os.Getenv(podExecEnv); spec != "" {
		execInPod(spec)
	}
	testbin.Main("deploy", func(root, dir string) int {
		moduleRoot, binDir = root, dir
		code := 0
		goleak.VerifyTestMain(m, goleak.Cleanup(func(c int) { code = c }))
		return code
	}, append(slices.Clone(testbin.Names), testbin.S3Server)...)
}

// Margins the grace periods keep beyond the programs' own timeouts: the
// renderer hands back what is left after its drain and the coordinator
// closes raft and bbolt after its shutdown timeout.
const graceMargin = 5 * time.Second

// leadershipHandOver is how long a coordinator that leads spends, on
// SIGTERM, handing leadership to another voter before it drains its calls
// (package cluster's handOverTimeout).
const leadershipHandOver = 3 * time.Second

// Health entries the probes must or must not read: the dispatch switch,
// which a paused coordinator reports NOT_SERVING, the leader's own entry,
// which followers report NOT_SERVING, and the entry of the job service,
// which follows the writer alone.
const (
	dispatchHealthEntry = "leasehold.v1.Dispatch"
	leaderHealthEntry   = leaderdial.HealthService
	jobsHealthEntry     = "leasehold.v1.JobService"
)

// principal is one entry of a principals file, as far as these tests read it.
type principal struct {
	Name             string   `json:"name"`
	Token            string   `json:"token"`
	Team             string   `json:"team"`
	Roles            []string `json:"roles"`
	Scope            []string `json:"scope"`
	RendererIDs      []string `json:"renderer_ids"`
	RendererIDPrefix string   `json:"renderer_id_prefix"`
}

// deployment is the manifests with each program's container and resolved
// configuration.
type deployment struct {
	*manifests
	coord, rend   *workload
	coordC, rendC *container
	coordP, rendP *program
	// coordPods are the StatefulSet's pods by ordinal, and coordCfgs the
	// configuration each is given; coordCfg is the first pod's.
	coordPods []string
	coordCfgs []config
	coordCfg  config
	rendCfg   config
	// peers is the first pod's --peers.
	peers []peer
}

// loadDeployment loads the manifests, finds the coordinator and renderer
// containers and resolves their configuration, for every pod of the
// coordinator's StatefulSet, against the binaries' --help, reporting every
// unknown flag or variable.
func loadDeployment(t *testing.T) *deployment {
	t.Helper()
	d := &deployment{manifests: loadManifests(t)}
	d.coord, d.coordC = d.workloadOf(t, "coordinator")
	d.rend, d.rendC = d.workloadOf(t, "renderer")
	d.coordP, d.rendP = helpOf(t, "coordinator"), helpOf(t, "renderer")
	d.coordPods = podNames(d.coord)
	for i, pod := range d.coordPods {
		cfg, errs := configOf(d.coordP, d.coordC, d.envResolver(pod))
		if i == 0 {
			for _, err := range errs {
				t.Error(err)
			}
		}
		d.coordCfgs = append(d.coordCfgs, cfg)
	}
	if len(d.coordCfgs) == 0 {
		t.Fatalf("%s has no pods", d.coord.Metadata.Name)
	}
	d.coordCfg = d.coordCfgs[0]
	var errs []error
	d.rendCfg, errs = configOf(d.rendP, d.rendC, d.envResolver(podNames(d.rend)[0]))
	for _, err := range errs {
		t.Error(err)
	}
	if s, ok := d.coordCfg["peers"]; ok {
		var err error
		if d.peers, err = parsePeers(s.value); err != nil {
			t.Errorf("%s=%q: %v", s.source, s.value, err)
		}
	}
	return d
}

// podNames returns the names the pods of w get, as fieldRef metadata.name
// sees them: a StatefulSet's by ordinal, one example of a Deployment's.
func podNames(w *workload) []string {
	if w.Kind != "StatefulSet" {
		return []string{w.Metadata.Name + "-5d8f7c9b6d-x2x7q"}
	}
	n := 1
	if w.Spec.Replicas != nil {
		n = *w.Spec.Replicas
	}
	var names []string
	for i := range n {
		names = append(names, fmt.Sprintf("%s-%d", w.Metadata.Name, i))
	}
	return names
}

// podIP is the address the test's pod network gives pod: the
// coordinators' from 10.244.0.10 by ordinal, the renderer's 10.244.0.100.
func (d *deployment) podIP(pod string) netip.Addr {
	if i := slices.Index(d.coordPods, pod); i >= 0 {
		return netip.AddrFrom4([4]byte{10, 244, 0, byte(10 + i)})
	}
	return netip.AddrFrom4([4]byte{10, 244, 0, 100})
}

// envResolver returns the value a variable of pod's container takes from
// a Secret (the example's value) or from the pod's own fields.
func (d *deployment) envResolver(pod string) func(envVar) (string, error) {
	return func(e envVar) (string, error) {
		switch {
		case e.ValueFrom == nil:
			return e.Value, nil
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s, ok := d.secrets[ref.Name]
			if !ok {
				return "", fmt.Errorf("Secret %s is not in %s", ref.Name, exampleSecrets)
			}
			v, ok := s.StringData[ref.Key]
			if !ok {
				return "", fmt.Errorf("Secret %s has no key %s in %s", ref.Name, ref.Key, exampleSecrets)
			}
			return v, nil
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				return pod, nil
			case "metadata.namespace":
				return d.kust.Namespace, nil
			case "status.podIP":
				return d.podIP(pod).String(), nil
			}
		}
		return "", fmt.Errorf("this test cannot resolve %+v; teach it", e.ValueFrom)
	}
}

// peer is one voter of --peers.
type peer struct {
	id, raft, grpc string
}

// parsePeers reads --peers as the coordinator does: id=raft_address or
// id=raft_address/grpc_address, comma-separated, spaces around items
// ignored.
func parsePeers(s string) ([]peer, error) {
	var peers []peer
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		id, addrs, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("peer %q is not id=raft_address/grpc_address", item)
		}
		raft, grpc, _ := strings.Cut(addrs, "/")
		peers = append(peers, peer{id, raft, grpc})
	}
	return peers, nil
}

// peerOf returns the voter of --peers whose id is pod.
func (d *deployment) peerOf(pod string) (peer, bool) {
	i := slices.IndexFunc(d.peers, func(p peer) bool { return p.id == pod })
	if i < 0 {
		return peer{}, false
	}
	return d.peers[i], true
}

// target is a client's coordinator address: a dns:/// target, resolved
// to every address of its name, or one or more host:port.
type target struct {
	dns   bool
	addrs []string
}

// parseTarget reads a coordinator address as the programs do.
func parseTarget(s string) (target, error) {
	if rest, ok := strings.CutPrefix(s, "dns:///"); ok {
		return target{dns: true, addrs: []string{rest}}, nil
	}
	if strings.Contains(s, "://") || strings.HasPrefix(s, "dns:") {
		return target{}, fmt.Errorf("%q: this test reads host:port, a list of them, or dns:///host:port; teach it", s)
	}
	var t target
	for a := range strings.SplitSeq(s, ",") {
		t.addrs = append(t.addrs, strings.TrimSpace(a))
	}
	return t, nil
}

// dnsForms returns the names the cluster DNS answers for name in
// namespace ns (a Service, or a pod under its headless Service): bare as
// the pods of ns resolve it, with the namespace, with .svc and with the
// cluster domain.
func dnsForms(name, ns string) []string {
	return []string{name, name + "." + ns, name + "." + ns + ".svc", name + "." + ns + ".svc.cluster.local"}
}

// hostOf reads a DNS name of the manifests' namespace: the Service it
// names, and the pod when it is a pod's name under a headless Service.
func (d *deployment) hostOf(host string) (svc, pod string, err error) {
	ns := d.kust.Namespace
	h, qualified := host, false
	for _, suffix := range []string{".svc.cluster.local", ".svc"} {
		if rest, ok := strings.CutSuffix(h, suffix); ok {
			h, qualified = rest, true
			break
		}
	}
	labels := strings.Split(h, ".")
	switch {
	case qualified && (len(labels) < 2 || labels[len(labels)-1] != ns):
		return "", "", fmt.Errorf("%s is not a name of namespace %s", host, ns)
	case qualified:
		labels = labels[:len(labels)-1]
	case len(labels) == 2 && labels[1] == ns && d.serviceNamed(labels[0]) != nil:
		labels = labels[:1]
	case len(labels) == 3 && labels[2] == ns:
		labels = labels[:2]
	}
	switch len(labels) {
	case 1:
		svc = labels[0]
	case 2:
		pod, svc = labels[0], labels[1]
	default:
		return "", "", fmt.Errorf("%s names no Service or pod of namespace %s", host, ns)
	}
	if d.serviceNamed(svc) == nil {
		return "", "", fmt.Errorf("%s: %s is not a Service of the manifests", host, svc)
	}
	return svc, pod, nil
}

// governing returns the coordinator StatefulSet's governing Service.
func (d *deployment) governing() *service { return d.serviceNamed(d.coord.Spec.ServiceName) }

// clientService returns the Service clients reach the coordinators by:
// the one selecting their pods that is not the StatefulSet's own.
func (d *deployment) clientService(t *testing.T) *service {
	t.Helper()
	for _, s := range d.services {
		if s.Metadata.Name != d.coord.Spec.ServiceName && selects(s.Spec.Selector, d.coord.Spec.Template.Metadata.Labels) {
			return s
		}
	}
	t.Fatal("no Service for clients selects the coordinator's pods")
	return nil
}

// principals returns the principals file the coordinator reads (--tokens),
// from the example Secret mounted at its path.
func (d *deployment) principals(t *testing.T) []principal {
	t.Helper()
	tokens, ok := d.coordCfg["tokens"]
	if !ok {
		t.Fatal("the coordinator has no --tokens: it refuses to serve a network address without a principals file")
	}
	vol, rel, ok := d.coord.mountOf(d.coordC, tokens.value)
	if !ok {
		t.Fatalf("%s=%s is on no volume of the coordinator", tokens.source, tokens.value)
	}
	name := d.coord.secretVolume(vol)
	s := d.secrets[name]
	if s == nil {
		t.Fatalf("%s=%s: volume %s is not an example Secret", tokens.source, tokens.value, vol)
	}
	data, ok := s.StringData[rel]
	if !ok {
		t.Fatalf("%s=%s: Secret %s has no key %s", tokens.source, tokens.value, name, rel)
	}
	var file struct {
		Principals []principal `json:"principals"`
	}
	if err := json.Unmarshal([]byte(data), &file); err != nil {
		t.Fatalf("principals in Secret %s: %v", name, err)
	}
	return file.Principals
}

// principalWithRole returns the first principal holding role.
func principalWithRole(t *testing.T, ps []principal, role string) principal {
	t.Helper()
	for _, p := range ps {
		if slices.Contains(p.Roles, role) {
			return p
		}
	}
	t.Fatalf("the example principals have no %s", role)
	return principal{}
}

// TestManifests checks the manifests against each other and against the
// programs' --help, without running anything but --help.
func TestManifests(t *testing.T) {
	t.Parallel()
	d := loadDeployment(t)
	coordLabels := d.coord.Spec.Template.Metadata.Labels

	t.Run("The kustomization lists every manifest and names the image the containers use", func(t *testing.T) {
		var listed []string
		for _, r := range d.kust.Resources {
			listed = append(listed, r)
			if _, err := os.Stat(filepath.Join(kubeDir, r)); err != nil {
				t.Errorf("kustomization resource %s: %v", r, err)
			}
		}
		for file := range d.files {
			if !slices.Contains(listed, file) {
				t.Errorf("%s is not listed in %s", file, kustomizationFn)
			}
		}
		if slices.Contains(listed, exampleSecrets) {
			t.Errorf("%s must not be applied; it holds placeholders", exampleSecrets)
		}
		if slices.Contains(listed, volumeShell) {
			t.Errorf("%s must not be applied with the rest; it runs only while the coordinators are stopped", volumeShell)
		}
		if d.kust.Namespace == "" {
			t.Error("the kustomization sets no namespace")
		}
		for _, w := range d.workloads {
			for _, c := range w.Spec.Template.Spec.Containers {
				image, _, _ := strings.Cut(c.Image, ":")
				if !slices.ContainsFunc(d.kust.Images, func(i kustImage) bool { return i.Name == image }) {
					t.Errorf("%s/%s runs image %s, which the kustomization's images do not name", w.Metadata.Name, c.Name, image)
				}
			}
		}
	})

	t.Run("The coordinator is three voters, each with a claim of its own, that find each other by their pods' names", func(t *testing.T) {
		if d.coord.Kind != "StatefulSet" || len(d.coordPods) != 3 {
			t.Errorf("coordinator: %s with replicas %v, want a StatefulSet of 3 (a quorum of two survives one loss; see deploy/README.md)", d.coord.Kind, d.coord.Spec.Replicas)
		}
		if p := d.coord.Spec.PodManagementPolicy; p != "Parallel" {
			t.Errorf("podManagementPolicy %q: a pod is ready only once the cluster has a leader, which takes two pods, so OrderedReady "+
				"never creates the second; want Parallel", p)
		}
		dataDir := d.coordCfg["data-dir"]
		vol, _, ok := d.coord.mountOf(d.coordC, dataDir.value)
		if !ok || !d.coord.claimVolume(vol) {
			t.Errorf("%s=%s is not on one of the StatefulSet's volumeClaimTemplates", dataDir.source, dataDir.value)
		}
		gov := d.governing()
		switch {
		case gov == nil || gov.Spec.ClusterIP != "None" || !selects(gov.Spec.Selector, coordLabels):
			t.Fatalf("serviceName %q is not a headless Service selecting the coordinator's pods: the pods would have no names of their own", d.coord.Spec.ServiceName)
		case !gov.Spec.PublishNotReadyAddresses:
			t.Errorf("Service %s does not publish pods that are not ready: a pod is ready once the cluster has a leader, "+
				"and the voters cannot elect one before their names resolve; set publishNotReadyAddresses", gov.Metadata.Name)
		}
		raftPort, grpcPort := mustPort(t, d.coordCfg, "raft-listen"), mustPort(t, d.coordCfg, "listen")
		if d.coordC.containerPort(raftPort) == 0 {
			t.Errorf("the coordinator listens for raft on %d but declares no such containerPort", raftPort)
		}
		if !slices.ContainsFunc(gov.Spec.Ports, func(p servicePort) bool { return p.Port == raftPort }) {
			t.Errorf("Service %s does not list the raft port %d", gov.Metadata.Name, raftPort)
		}
		if len(d.peers) != len(d.coordPods) {
			t.Errorf("--peers lists %d voters, the StatefulSet runs %d pods: each pod is a voter, and no other", len(d.peers), len(d.coordPods))
		}
		for i, pod := range d.coordPods {
			cfg := d.coordCfgs[i]
			if id := cfg["node-id"]; id.value != pod {
				t.Errorf("pod %s: node id from %s is %q, want the pod's name (fieldRef metadata.name)", pod, id.source, id.value)
			}
			if cfg["peers"].value != d.coordCfg["peers"].value {
				t.Errorf("pod %s gets --peers %q, pod %s %q: every voter gets the same", pod, cfg["peers"].value, d.coordPods[0], d.coordCfg["peers"].value)
			}
			p, ok := d.peerOf(pod)
			if !ok {
				t.Errorf("--peers has no voter %s", pod)
				continue
			}
			for _, a := range []struct {
				what, addr string
				port       int
			}{{"raft", p.raft, raftPort}, {"gRPC", p.grpc, grpcPort}} {
				host, port, err := splitHostPort(a.addr)
				if err != nil {
					t.Errorf("voter %s: %s address %q: %v", pod, a.what, a.addr, err)
					continue
				}
				svc, named, err := d.hostOf(host)
				if err != nil || svc != gov.Metadata.Name || named != pod || port != a.port {
					t.Errorf("voter %s: %s address %s, want the pod's name under %s with port %d (%v)", pod, a.what, a.addr, gov.Metadata.Name, a.port, err)
				}
			}
			// Without it the leader announces --listen, ":7070", which
			// names no host a follower's client could dial.
			if adv := cfg["grpc-advertise"]; adv.value != p.grpc {
				t.Errorf("pod %s announces %q (%s) when it leads, want its gRPC address in --peers %q", pod, adv.value, cmp.Or(adv.source, "--listen"), p.grpc)
			}
			if adv, ok := cfg["raft-advertise"]; ok && adv.value != "" && adv.value != p.raft {
				t.Errorf("pod %s advertises raft at %q, --peers says %q", pod, adv.value, p.raft)
			}
		}
		spread := false
		if a := d.coord.Spec.Template.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
			for _, term := range a.PodAntiAffinity.Required {
				spread = spread || (term.TopologyKey == "kubernetes.io/hostname" && selects(term.LabelSelector.MatchLabels, coordLabels))
			}
		}
		if !spread {
			t.Error("no required pod anti-affinity on kubernetes.io/hostname keeps the voters on different nodes: one node's loss could take the quorum")
		}
		var budget *disruptionBudget
		for _, b := range d.budgets {
			if selects(b.Spec.Selector.MatchLabels, coordLabels) {
				budget = b
			}
		}
		if budget == nil {
			t.Fatal("no PodDisruptionBudget selects the coordinator's pods")
		}
		if budget.Spec.MaxUnavailable != 1 || budget.Spec.MinAvailable != nil {
			t.Errorf("the coordinator's PodDisruptionBudget has maxUnavailable %v, minAvailable %v; want maxUnavailable 1: "+
				"an eviction may take one voter, never two", budget.Spec.MaxUnavailable, budget.Spec.MinAvailable)
		}
	})

	t.Run("Only the coordinators reach the raft port, only the monitoring namespace the metrics port; anyone reaches gRPC", func(t *testing.T) {
		raftPort := mustPort(t, d.coordCfg, "raft-listen")
		metricsPort := mustPort(t, d.coordCfg, "metrics-listen")
		open := map[int]bool{}
		monitored := false
		var policies int
		for _, np := range d.policies {
			if !selects(np.Spec.PodSelector.MatchLabels, coordLabels) || !slices.Contains(np.Spec.PolicyTypes, "Ingress") {
				continue
			}
			policies++
			for _, rule := range np.Spec.Ingress {
				var ports []int
				for _, p := range rule.Ports {
					n := d.coordC.containerPort(p.Port)
					if n == 0 {
						t.Errorf("NetworkPolicy %s allows port %v, which the coordinator does not declare", np.Metadata.Name, p.Port)
					}
					ports = append(ports, n)
				}
				if len(rule.Ports) == 0 || slices.Contains(ports, raftPort) {
					if len(rule.From) == 0 {
						t.Errorf("NetworkPolicy %s lets any pod reach the raft port", np.Metadata.Name)
					}
					for _, from := range rule.From {
						if from.PodSelector == nil || !selects(from.PodSelector.MatchLabels, coordLabels) ||
							selects(from.PodSelector.MatchLabels, d.rend.Spec.Template.Metadata.Labels) {
							t.Errorf("NetworkPolicy %s lets pods other than the coordinators reach the raft port: %+v", np.Metadata.Name, from)
						}
					}
				}
				if len(rule.Ports) == 0 || slices.Contains(ports, metricsPort) {
					if len(rule.From) == 0 {
						t.Errorf("NetworkPolicy %s lets any pod reach the metrics port", np.Metadata.Name)
					}
					for _, from := range rule.From {
						if from.PodSelector != nil || from.NamespaceSelector == nil || from.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "" {
							t.Errorf("NetworkPolicy %s lets more than one namespace reach the metrics port: %+v", np.Metadata.Name, from)
						} else {
							monitored = true
						}
					}
				}
				if len(rule.From) == 0 {
					for _, p := range ports {
						open[p] = true
					}
				}
			}
		}
		if policies == 0 {
			t.Error("no NetworkPolicy selects the coordinators: any pod may open the raft port, which mutual TLS alone then guards")
		}
		if p := mustPort(t, d.coordCfg, "listen"); policies > 0 && !open[p] {
			t.Errorf("no NetworkPolicy rule lets clients reach --listen's port %d", p)
		}
		if policies > 0 && !monitored {
			t.Errorf("no NetworkPolicy rule lets the monitoring namespace reach --metrics-listen's port %d", metricsPort)
		}
	})

	t.Run("The volume shell mounts the first coordinator's claim where the coordinator does, as its user", func(t *testing.T) {
		if len(d.pods) != 1 {
			t.Fatalf("want one Pod in %s, found %d", volumeShell, len(d.pods))
		}
		p := d.pods[0]
		if len(d.coord.Spec.VolumeClaimTemplates) != 1 {
			t.Fatalf("want one volumeClaimTemplate on the coordinator, found %d", len(d.coord.Spec.VolumeClaimTemplates))
		}
		claimVol := d.coord.Spec.VolumeClaimTemplates[0].Metadata.Name
		// A StatefulSet's claims are named <template>-<statefulset>-<ordinal>.
		wantClaim := claimVol + "-" + d.coordPods[0]
		var coordMount string
		for _, vm := range d.coordC.VolumeMounts {
			if vm.Name == claimVol {
				coordMount = vm.MountPath
			}
		}
		found := false
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim == nil {
				continue
			}
			found = true
			if v.PersistentVolumeClaim.ClaimName != wantClaim {
				t.Errorf("%s mounts claim %s, want the first coordinator's %s", volumeShell, v.PersistentVolumeClaim.ClaimName, wantClaim)
			}
			for _, c := range p.Spec.Containers {
				for _, vm := range c.VolumeMounts {
					if vm.Name == v.Name && vm.MountPath != coordMount {
						t.Errorf("%s mounts the volume at %s, the coordinator at %s; the runbooks' paths are the coordinator's", volumeShell, vm.MountPath, coordMount)
					}
				}
			}
		}
		if !found {
			t.Errorf("%s mounts no claim", volumeShell)
		}
		ps, cs := p.Spec.SecurityContext, d.coord.Spec.Template.Spec.SecurityContext
		if ps.RunAsUser != cs.RunAsUser || ps.RunAsGroup != cs.RunAsGroup {
			t.Errorf("%s runs as %d:%d, the coordinator as %d:%d", volumeShell, ps.RunAsUser, ps.RunAsGroup, cs.RunAsUser, cs.RunAsGroup)
		}
	})

	t.Run("Selectors select their own pod templates", func(t *testing.T) {
		for _, w := range d.workloads {
			if !selects(w.Spec.Selector.MatchLabels, w.Spec.Template.Metadata.Labels) {
				t.Errorf("%s %s: selector %v does not match its template's labels %v", w.Kind, w.Metadata.Name, w.Spec.Selector.MatchLabels, w.Spec.Template.Metadata.Labels)
			}
		}
	})

	t.Run("Listen addresses, container ports, Services, probes and scrape annotations agree", func(t *testing.T) {
		grpcPort := mustPort(t, d.coordCfg, "listen")
		metricsPort := mustPort(t, d.coordCfg, "metrics-listen")
		httpPort := mustPort(t, d.rendCfg, "http-listen")
		for _, c := range []struct {
			ctr  *container
			port int
			what string
		}{{d.coordC, grpcPort, "--listen"}, {d.coordC, metricsPort, "--metrics-listen"}, {d.rendC, httpPort, "--http-listen"}} {
			if c.ctr.containerPort(c.port) == 0 {
				t.Errorf("container %s listens on %d (%s) but declares no such containerPort", c.ctr.Name, c.port, c.what)
			}
		}
		listens := map[*container][]int{d.coordC: {grpcPort, metricsPort}, d.rendC: {httpPort}}
		for c, ports := range listens {
			for name, p := range c.probes() {
				port := 0
				switch {
				case p.GRPC != nil:
					port = p.GRPC.Port
				case p.HTTPGet != nil:
					port = c.containerPort(p.HTTPGet.Port)
				}
				if !slices.Contains(ports, port) {
					t.Errorf("%s %s probe %+v: want a probe on a port the program listens on, %v", c.Name, name, p, ports)
				}
			}
		}
		// The metrics address serves HTTPS when the coordinator has a
		// certificate; the renderer's is plain HTTP.
		wantScheme := map[*workload]string{d.coord: "http", d.rend: "http"}
		if d.coordTLS() {
			wantScheme[d.coord] = "https"
		}
		for w, port := range map[*workload]int{d.coord: metricsPort, d.rend: httpPort} {
			a := w.Spec.Template.Metadata.Annotations
			scheme := cmp.Or(a["prometheus.io/scheme"], "http")
			if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != fmt.Sprint(port) || a["prometheus.io/path"] != "/metrics" || scheme != wantScheme[w] {
				t.Errorf("%s: scrape annotations %v, want scrape true, scheme %s, port %d, path /metrics", w.Metadata.Name, a, wantScheme[w], port)
			}
		}
		for _, s := range d.services {
			var target *workload
			for _, w := range d.workloads {
				if selects(s.Spec.Selector, w.Spec.Template.Metadata.Labels) {
					target = w
				}
			}
			if target == nil {
				t.Errorf("Service %s selects no pod template", s.Metadata.Name)
				continue
			}
			for _, p := range s.Spec.Ports {
				n := 0
				for _, c := range target.Spec.Template.Spec.Containers {
					n = cmp.Or(n, c.containerPort(p.TargetPort))
				}
				switch {
				case n == 0:
					t.Errorf("Service %s port %s targets %v, which %s's containers do not declare", s.Metadata.Name, p.Name, p.TargetPort, target.Metadata.Name)
				case s.Spec.ClusterIP == "None" && n != p.Port:
					// A headless Service's name resolves to the pods, which
					// clients dial on the Service's port number.
					t.Errorf("headless Service %s port %d targets container port %d; its clients dial the pods on %d", s.Metadata.Name, p.Port, n, p.Port)
				}
				if p.AppProtocol == "kubernetes.io/h2c" && target == d.coord && d.coordTLS() {
					t.Errorf("Service %s port %s says kubernetes.io/h2c (HTTP/2 in the clear), but the coordinator serves TLS", s.Metadata.Name, p.Name)
				}
			}
		}
	})

	t.Run("The renderers dial every replica and follow the leader", func(t *testing.T) {
		grpcPort := mustPort(t, d.coordCfg, "listen")
		addr := d.rendCfg["coordinator"]
		tg, err := parseTarget(addr.value)
		if err != nil {
			t.Fatalf("renderer %s: %v", addr.source, err)
		}
		if !tg.dns && len(tg.addrs) < 2 {
			t.Fatalf("renderer %s=%s reaches one replica: name the coordinators' headless Service as dns:///name:port, or list every pod", addr.source, addr.value)
		}
		listed := map[string]bool{}
		for _, a := range tg.addrs {
			host, port, err := splitHostPort(a)
			if err != nil {
				t.Errorf("renderer %s=%s: %v", addr.source, addr.value, err)
				continue
			}
			svc, pod, err := d.hostOf(host)
			switch {
			case err != nil:
				t.Errorf("renderer %s=%s: %v", addr.source, addr.value, err)
			case tg.dns && pod != "":
				t.Errorf("renderer %s=%s: a dns target of one pod's name reaches that pod alone", addr.source, addr.value)
			case tg.dns:
				s := d.serviceNamed(svc)
				if !selects(s.Spec.Selector, coordLabels) || s.Spec.ClusterIP != "None" {
					t.Errorf("renderer %s=%s: Service %s is not a headless Service of the coordinators: a cluster IP pins each "+
						"connection to one pod, and the client cannot find the leader", addr.source, addr.value, svc)
				}
				if n, err := d.serviceTarget(a); err != nil || n != grpcPort {
					t.Errorf("renderer %s=%s reaches container port %d (%v), want the coordinator's --listen port %d", addr.source, addr.value, n, err, grpcPort)
				}
			case svc != d.coord.Spec.ServiceName || port != grpcPort:
				t.Errorf("renderer %s=%s: %s is not a coordinator pod's gRPC address", addr.source, addr.value, a)
			default:
				listed[pod] = true
			}
		}
		if !tg.dns && len(listed) != len(d.coordPods) {
			t.Errorf("renderer %s=%s lists %d of the %d coordinators", addr.source, addr.value, len(listed), len(d.coordPods))
		}
	})

	t.Run("The coordinator's probes ask its health as a kubelet can: readiness the server's, liveness the writer's", func(t *testing.T) {
		metricsPort := mustPort(t, d.coordCfg, "metrics-listen")
		probes := d.coordC.probes()
		for _, name := range []string{"startup", "readiness", "liveness"} {
			if probes[name] == nil {
				t.Errorf("the coordinator has no %s probe", name)
			}
		}
		// The health entry each probe reads: gRPC names it, the HTTP
		// endpoints stand for one (coordinator/httphealth.go).
		httpEntry := map[string]string{"/healthz": jobsHealthEntry, "/readyz": ""}
		for name, p := range probes {
			entry, known := "", false
			switch {
			case p.GRPC != nil && d.coordTLS():
				t.Errorf("%s probe is a grpc probe, which the kubelet asks in plaintext: it cannot pass against a coordinator serving TLS; "+
					"probe /healthz or /readyz over HTTPS on the metrics port", name)
				continue
			case p.GRPC != nil:
				entry, known = "", true
				if p.GRPC.Service != nil {
					entry = *p.GRPC.Service
				}
			case p.HTTPGet != nil:
				if port := d.coordC.containerPort(p.HTTPGet.Port); port != metricsPort {
					t.Errorf("%s probe on port %v; the health endpoints are on the metrics port %d", name, p.HTTPGet.Port, metricsPort)
				}
				if scheme := cmp.Or(p.HTTPGet.Scheme, "HTTP"); d.coordTLS() != (scheme == "HTTPS") {
					t.Errorf("%s probe scheme %s, but the metrics port serves %s", name, scheme, map[bool]string{true: "HTTPS", false: "HTTP"}[d.coordTLS()])
				}
				entry, known = httpEntry[p.HTTPGet.Path]
			}
			switch {
			case !known:
				t.Errorf("%s probe %+v reads no health entry this test knows", name, p)
			case entry == dispatchHealthEntry:
				t.Errorf("%s reads %s, which is NOT_SERVING while dispatch is paused: a pause would cut clients off", name, entry)
			case entry == leaderHealthEntry:
				t.Errorf("%s reads %s, which only the leader reports SERVING: followers would be taken out or restarted", name, entry)
			case name == "readiness" && entry != "":
				t.Errorf(`readiness reads %q, want the server entry "" (/readyz): SERVING while the pod is part of a cluster with a leader; `+
					`a service's entry is SERVING on a pod that knows no leader`, entry)
			case name != "readiness" && entry == "":
				t.Errorf(`%s reads the server entry "", which a cluster without a leader reports NOT_SERVING: the kubelet would `+
					`restart every voter, over and over, for what a restart cannot mend; read /healthz`, name)
			}
		}
	})

	t.Run("Tokens and raft cross the network over TLS only; no manifest turns on plaintext tokens or the development tokens", func(t *testing.T) {
		for _, w := range d.workloads {
			for _, c := range w.Spec.Template.Spec.Containers {
				for _, a := range c.Args {
					name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
					if name == "insecure-plaintext" || name == "dev" {
						t.Errorf("%s/%s passes %s", w.Metadata.Name, c.Name, a)
					}
				}
				for _, e := range c.Env {
					if e.Name == "LEASEHOLD_INSECURE_PLAINTEXT" || e.Name == "LEASEHOLD_DEV" {
						t.Errorf("%s/%s sets %s", w.Metadata.Name, c.Name, e.Name)
					}
				}
			}
		}
		if _, ok := d.coordCfg["tokens"]; !ok {
			t.Error("the coordinator has no --tokens: it would use the public development tokens")
		}
		var tlsSecrets []string
		for _, flag := range []string{"tls-cert", "tls-key", "tls-peer-cert", "tls-peer-key"} {
			s, ok := d.coordCfg[flag]
			if !ok || s.value == "" {
				t.Errorf("the coordinator has no --%s: it serves bearer tokens, and raft, in plaintext", flag)
				continue
			}
			vol, rel, ok := d.coord.mountOf(d.coordC, s.value)
			name := d.coord.secretVolume(vol)
			if !ok || name == "" {
				t.Errorf("%s=%s is on no Secret volume of the coordinator", s.source, s.value)
				continue
			}
			sec := d.secrets[name]
			if sec == nil || sec.Type != tlsSecretType {
				t.Errorf("%s=%s: Secret %s is no example of type %s (cert-manager's and kubectl create secret tls's)", s.source, s.value, name, tlsSecretType)
				continue
			}
			if _, ok := sec.StringData[rel]; !ok {
				t.Errorf("%s=%s: Secret %s has no key %s", s.source, s.value, name, rel)
			}
			tlsSecrets = append(tlsSecrets, name)
		}
		// A CA is public: a ConfigMap. The coordinators verify their
		// peers with the peer CA, the renderers the coordinators with
		// theirs, which must be another.
		for _, c := range []struct {
			w    *workload
			ctr  *container
			cfg  config
			flag string
		}{{d.coord, d.coordC, d.coordCfg, "tls-peer-ca"}, {d.rend, d.rendC, d.rendCfg, "tls-ca"}} {
			ca, ok := c.cfg[c.flag]
			if !ok || ca.value == "" {
				t.Errorf("%s has no --%s: it cannot verify the coordinators", c.w.Metadata.Name, c.flag)
				continue
			}
			vol, rel, ok := c.w.mountOf(c.ctr, ca.value)
			name := c.w.configMapVolume(vol)
			if !ok || name == "" || d.configMaps[name] == nil {
				t.Errorf("%s %s=%s is on no example ConfigMap: the CA is public, and a Secret beside the coordinator's key invites mounting the key", c.w.Metadata.Name, ca.source, ca.value)
			} else if _, ok := d.configMaps[name].Data[rel]; !ok {
				t.Errorf("%s %s=%s: ConfigMap %s has no key %s", c.w.Metadata.Name, ca.source, ca.value, name, rel)
			}
		}
		if peerCA, clientCA := d.configMapOf(t, d.coord, d.coordC, d.coordCfg, "tls-peer-ca"), d.configMapOf(t, d.rend, d.rendC, d.rendCfg, "tls-ca"); peerCA == clientCA {
			t.Errorf("the coordinators' --tls-peer-ca is ConfigMap %s, the CA the renderers trust: the peers need a CA of their own", peerCA)
		}
		if d.tlsSecretOf(t, "tls-cert") == d.tlsSecretOf(t, "tls-peer-cert") {
			t.Error("the peer certificate is the coordinators' certificate: the peers need one of their own, from the peer CA")
		}
		for _, w := range d.workloads {
			for _, v := range w.Spec.Template.Spec.Volumes {
				if w != d.coord && v.Secret != nil && slices.Contains(tlsSecrets, v.Secret.SecretName) {
					t.Errorf("%s mounts Secret %s, a private key of the coordinators", w.Metadata.Name, v.Secret.SecretName)
				}
			}
		}
	})

	t.Run("deploy/README.md says how to make a certificate for every name a client verifies, and a peer certificate of every voter", func(t *testing.T) {
		readme, err := os.ReadFile("README.md")
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range append(d.certNames(t), "server_name: "+d.scrapeServerName(t)) {
			if !bytes.Contains(readme, []byte(name)) {
				t.Errorf("deploy/README.md does not mention %s", name)
			}
		}
		serving, peer := d.readmeCertificates(t)
		for _, name := range d.certNames(t) {
			if !slices.Contains(serving.DNSNames, name) {
				t.Errorf("the README's Certificate does not carry %s", name)
			}
		}
		if !slices.Contains(serving.Usages, "server auth") {
			t.Errorf("the README's Certificate has usages %v, want server auth: the coordinators present it to clients", serving.Usages)
		}
		for _, p := range d.peers {
			if !slices.Contains(peer.URIs, security.NodeURI(p.id)) {
				t.Errorf("the README's peer Certificate does not carry %s, which the other voters check", security.NodeURI(p.id))
			}
		}
		for _, usage := range []string{"server auth", "client auth"} {
			if !slices.Contains(peer.Usages, usage) {
				t.Errorf("the README's peer Certificate has usages %v, want %q: a voter presents it when it dials and when it is dialled", peer.Usages, usage)
			}
		}
		if serving.IssuerRef == peer.IssuerRef {
			t.Errorf("both of the README's Certificates come from %s: the peer certificate needs a CA of its own", serving.IssuerRef.Name)
		}
	})

	t.Run("Grace periods cover the renderer's drain and the coordinator's hand-over and shutdown", func(t *testing.T) {
		for _, c := range []struct {
			w     *workload
			cfg   config
			flag  string
			extra time.Duration
		}{{d.rend, d.rendCfg, "drain-timeout", 0}, {d.coord, d.coordCfg, "shutdown-timeout", leadershipHandOver}} {
			s, ok := c.cfg[c.flag]
			if !ok {
				t.Errorf("%s: no value for --%s, not even a default in --help", c.w.Metadata.Name, c.flag)
				continue
			}
			timeout, err := time.ParseDuration(s.value)
			if err != nil {
				t.Errorf("%s=%s: %v", s.source, s.value, err)
				continue
			}
			grace := 30 * time.Second // Kubernetes' default
			if g := c.w.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
				grace = time.Duration(*g) * time.Second
			}
			if want := c.extra + timeout + graceMargin; grace < want {
				t.Errorf("%s: terminationGracePeriodSeconds %v, want at least %v (%s=%s, %v before it, %v after)", c.w.Metadata.Name, grace, want, s.source, s.value, c.extra, graceMargin)
			}
		}
	})

	t.Run("Every Secret and ConfigMap a pod reads is in the example, and the renderer credential allows the pods' names", func(t *testing.T) {
		for _, w := range d.workloads {
			for _, v := range w.Spec.Template.Spec.Volumes {
				if v.Secret != nil && d.secrets[v.Secret.SecretName] == nil {
					t.Errorf("%s mounts Secret %s, which %s lacks", w.Metadata.Name, v.Secret.SecretName, exampleSecrets)
				}
				if v.ConfigMap != nil && d.configMaps[v.ConfigMap.Name] == nil {
					t.Errorf("%s mounts ConfigMap %s, which %s lacks", w.Metadata.Name, v.ConfigMap.Name, exampleSecrets)
				}
			}
		}
		ps := d.principals(t)
		token := d.rendCfg["token"]
		var rp *principal
		for i := range ps {
			if ps[i].Token == token.value {
				rp = &ps[i]
			}
		}
		if rp == nil || !slices.Contains(rp.Roles, "renderer") {
			t.Fatalf("the renderer's token (%s) is no renderer principal's in the principals file", token.source)
		}
		id := d.rendCfg["id"]
		if id.value != podNames(d.rend)[0] {
			t.Errorf("renderer id comes from %s=%q, want the pod's name (ids must be unique among live renderers)", id.source, id.value)
		}
		podPrefix := d.rend.Metadata.Name + "-"
		if !slices.Contains(rp.RendererIDs, "*") && (rp.RendererIDPrefix == "" || !strings.HasPrefix(podPrefix, rp.RendererIDPrefix)) {
			t.Errorf("principal %s allows ids %v and prefix %q, not the pods' names %s...", rp.Name, rp.RendererIDs, rp.RendererIDPrefix, podPrefix)
		}
	})

	t.Run("Pods run as a non-root user with a read-only root and no privileges", func(t *testing.T) {
		for _, w := range d.workloads {
			ps := w.Spec.Template.Spec
			if !ps.SecurityContext.RunAsNonRoot || ps.SecurityContext.RunAsUser == 0 {
				t.Errorf("%s: pod securityContext %+v, want runAsNonRoot and a non-zero runAsUser", w.Metadata.Name, ps.SecurityContext)
			}
			for _, c := range ps.Containers {
				sc := c.SecurityContext
				if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !sc.ReadOnlyRootFilesystem || !slices.Contains(sc.Capabilities.Drop, "ALL") {
					t.Errorf("%s/%s: securityContext %+v, want no privilege escalation, a read-only root and every capability dropped", w.Metadata.Name, c.Name, sc)
				}
			}
		}
	})
}

// tlsSecretType is the type of a Secret holding a certificate and its key
// as tls.crt and tls.key.
const tlsSecretType = "kubernetes.io/tls"

// caKey is the key of a CA certificate in a Secret or ConfigMap, as
// cert-manager names it.
const caKey = "ca.crt"

// coordTLS reports whether the coordinator serves TLS.
func (d *deployment) coordTLS() bool {
	return d.coordCfg["tls-cert"].value != ""
}

// serviceDNSNames returns the names a pod may reach the coordinators'
// client Service by: its name, with its namespace, with .svc and with the
// cluster domain.
func (d *deployment) serviceDNSNames(t *testing.T) []string {
	t.Helper()
	return dnsForms(d.clientService(t).Metadata.Name, d.kust.Namespace)
}

// certNames returns every name the coordinators' certificate must carry:
// the client Service's, and each host of --peers and of the renderers'
// address, under which peers and clients verify it.
func (d *deployment) certNames(t *testing.T) []string {
	t.Helper()
	names := d.serviceDNSNames(t)
	hosts := func(addrs ...string) {
		for _, a := range addrs {
			if host, _, err := splitHostPort(a); err == nil && !slices.Contains(names, host) {
				names = append(names, host)
			}
		}
	}
	for _, p := range d.peers {
		hosts(p.raft, p.grpc)
	}
	if tg, err := parseTarget(d.rendCfg["coordinator"].value); err == nil {
		hosts(tg.addrs...)
	}
	return names
}

// scrapeServerName is the name Prometheus verifies the coordinators'
// certificate against when it scrapes a pod by IP (deploy/README.md).
func (d *deployment) scrapeServerName(t *testing.T) string {
	t.Helper()
	return d.serviceDNSNames(t)[2]
}

// certificateSpec is the part of a cert-manager Certificate these tests
// read.
type certificateSpec struct {
	SecretName string `yaml:"secretName"`
	IssuerRef  struct {
		Kind string `yaml:"kind"`
		Name string `yaml:"name"`
	} `yaml:"issuerRef"`
	DNSNames   []string `yaml:"dnsNames"`
	URIs       []string `yaml:"uris"`
	Usages     []string `yaml:"usages"`
	PrivateKey struct {
		Algorithm string `yaml:"algorithm"`
		Size      int    `yaml:"size"`
	} `yaml:"privateKey"`
}

// readmeCertificates returns the cert-manager Certificates
// deploy/README.md shows, decoded strictly: the coordinators' (the one
// whose Secret --tls-cert is on) and the peers' (--tls-peer-cert's). The
// run test issues its certificates from them.
func (d *deployment) readmeCertificates(t *testing.T) (serving, peer certificateSpec) {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]certificateSpec{}
	for _, block := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(readme, -1) {
		if !bytes.Contains(block[1], []byte("kind: Certificate\n")) {
			continue
		}
		var c struct {
			APIVersion string          `yaml:"apiVersion"`
			Kind       string          `yaml:"kind"`
			Metadata   objectMeta      `yaml:"metadata"`
			Spec       certificateSpec `yaml:"spec"`
		}
		if err := decodeStrict(block[1], &c); err != nil {
			t.Fatalf("the README's Certificate: %v", err)
		}
		found[c.Spec.SecretName] = c.Spec
	}
	serving, ok := found[d.tlsSecretOf(t, "tls-cert")]
	if !ok {
		t.Fatalf("deploy/README.md shows no cert-manager Certificate writing Secret %s, which --tls-cert is on", d.tlsSecretOf(t, "tls-cert"))
	}
	peer, ok = found[d.tlsSecretOf(t, "tls-peer-cert")]
	if !ok {
		t.Fatalf("deploy/README.md shows no cert-manager Certificate writing Secret %s, which --tls-peer-cert is on", d.tlsSecretOf(t, "tls-peer-cert"))
	}
	if len(found) != 2 {
		t.Fatalf("deploy/README.md shows %d cert-manager Certificates, want two", len(found))
	}
	return serving, peer
}

// tlsSecretOf returns the Secret the coordinator's flag names a file of.
func (d *deployment) tlsSecretOf(t *testing.T, flag string) string {
	t.Helper()
	return d.coord.secretVolume(mustVolumeOf(t, d.coord, d.coordC, d.coordCfg[flag].value))
}

// configMapOf returns the ConfigMap w's flag names a file of.
func (d *deployment) configMapOf(t *testing.T, w *workload, c *container, cfg config, flag string) string {
	t.Helper()
	return w.configMapVolume(mustVolumeOf(t, w, c, cfg[flag].value))
}

// mustVolumeOf returns the volume of w holding path.
func mustVolumeOf(t *testing.T, w *workload, c *container, path string) string {
	t.Helper()
	vol, _, ok := w.mountOf(c, path)
	if !ok {
		t.Fatalf("%s is on no volume of %s", path, w.Metadata.Name)
	}
	return vol
}

// probes returns a container's probes by kind.
func (c *container) probes() map[string]*probe {
	out := map[string]*probe{}
	for name, p := range map[string]*probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p != nil {
			out[name] = p
		}
	}
	return out
}

// mustPort returns the port of a host:port flag.
func mustPort(t *testing.T, cfg config, flag string) int {
	t.Helper()
	s, ok := cfg[flag]
	if !ok {
		t.Fatalf("no value for --%s", flag)
	}
	port, err := s.port()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// serviceTarget resolves "service:port" (or service.namespace.svc...:port)
// to the container port the Service sends it to.
func (d *deployment) serviceTarget(addr string) (int, error) {
	host, port, err := splitHostPort(addr)
	if err != nil {
		return 0, err
	}
	name, _, _ := strings.Cut(host, ".")
	s := d.serviceNamed(name)
	if s == nil {
		return 0, fmt.Errorf("%s is not a Service of the manifests", name)
	}
	for _, p := range s.Spec.Ports {
		if p.Port != port {
			continue
		}
		for _, w := range d.workloads {
			if !selects(s.Spec.Selector, w.Spec.Template.Metadata.Labels) {
				continue
			}
			for _, c := range w.Spec.Template.Spec.Containers {
				if n := c.containerPort(p.TargetPort); n != 0 {
					return n, nil
				}
			}
		}
	}
	return 0, errors.New("Service " + name + " has no port " + fmt.Sprint(port) + " reaching a container")
}

// TestDockerfile checks the image definition against go.mod, the commands
// the manifests run and the packages it builds.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	var froms, copies []string
	var user, entrypoint string
	args := map[string]string{}     // the ARG defaults before the first FROM
	unpinnable := map[string]bool{} // FROM lines that name no ARG
	for _, line := range strings.Split(text, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "ARG":
			if name, value, ok := strings.Cut(fields[1], "="); ok && len(froms) == 0 {
				args[name] = value
			}
		case "FROM":
			image := fields[1]
			if name, ok := strings.CutPrefix(image, "${"); ok && strings.HasSuffix(name, "}") {
				image = args[strings.TrimSuffix(name, "}")]
			} else {
				unpinnable[image] = true
			}
			froms = append(froms, image)
		case "COPY":
			if strings.HasPrefix(fields[1], "--from=") {
				copies = append(copies, fields[2:]...)
			}
		case "USER":
			user = fields[1]
		case "ENTRYPOINT":
			var ep []string
			if err := json.Unmarshal([]byte(strings.TrimSpace(strings.TrimPrefix(line, fields[0]))), &ep); err != nil || len(ep) == 0 {
				t.Fatalf("ENTRYPOINT %q: want the exec form", line)
			}
			entrypoint = ep[0]
		}
	}
	if len(froms) < 2 {
		t.Fatalf("want a multi-stage build, found FROM %v", froms)
	}

	t.Run("Every base image is a build argument with a tag that builds as it is, so that a build can pin its digest", func(t *testing.T) {
		for image := range unpinnable {
			t.Errorf("FROM %s names no ARG: a build cannot pin it by digest without editing the file", image)
		}
		for _, image := range froms {
			if image == "" || strings.Contains(image, "@sha256:<") || strings.Contains(image, "<digest>") {
				t.Errorf("base image default %q does not build as it is", image)
			}
		}
	})

	t.Run("The build stage uses the Go release of go.mod", func(t *testing.T) {
		mod, err := os.ReadFile(filepath.Join(moduleRoot, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(mod)
		if m == nil {
			t.Fatal("go.mod has no go directive")
		}
		if want := "golang:" + string(m[1]); !strings.HasPrefix(froms[0], want) {
			t.Errorf("build stage FROM %s, want %s (go.mod says go %s)", froms[0], want, m[1])
		}
	})

	t.Run("Binaries are static and the final stage is distroless, non-root", func(t *testing.T) {
		if !strings.Contains(text, "CGO_ENABLED=0") {
			t.Error("the build does not set CGO_ENABLED=0")
		}
		if last := froms[len(froms)-1]; !strings.Contains(last, "distroless/static") {
			t.Errorf("final stage FROM %s, want distroless/static", last)
		}
		uid, _, _ := strings.Cut(user, ":")
		if user == "" || uid == "0" || uid == "root" {
			t.Errorf("USER %q: want a non-root user", user)
		}
	})

	t.Run("It builds packages that exist and installs every command the manifests run", func(t *testing.T) {
		pkgs := regexp.MustCompile(`\./[a-z0-9/]+`).FindAllString(text, -1)
		if len(pkgs) == 0 {
			t.Fatal("no ./package paths in the Dockerfile")
		}
		for _, p := range pkgs {
			matches, _ := filepath.Glob(filepath.Join(moduleRoot, p, "*.go"))
			if len(matches) == 0 {
				t.Errorf("the Dockerfile builds %s, which holds no Go files", p)
			}
		}
		if len(copies) < 2 {
			t.Fatalf("COPY --from lines give %v, want sources and a destination", copies)
		}
		dest := copies[len(copies)-1]
		var installed []string
		for _, src := range copies[:len(copies)-1] {
			installed = append(installed, filepath.Join(dest, filepath.Base(src)))
		}
		m := loadManifests(t)
		commands := []string{entrypoint}
		for _, w := range m.workloads {
			for _, c := range w.Spec.Template.Spec.Containers {
				if len(c.Command) == 0 {
					t.Errorf("%s/%s has no command; say which program of the image it runs", w.Metadata.Name, c.Name)
					continue
				}
				commands = append(commands, c.Command[0])
			}
		}
		for _, c := range commands {
			if !slices.Contains(installed, c) {
				t.Errorf("%s is run but the image installs only %v", c, installed)
			}
		}
	})
}

// rulesFile is the Prometheus rules file.
const rulesFile = "prometheus/leasehold.rules.yml"

type ruleGroups struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record      string            `yaml:"record"`
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func loadRules(t *testing.T) ruleGroups {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rg ruleGroups
	if err := decodeStrict(data, &rg); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return rg
}

// runbookURL is how alerts link their runbook.
var runbookURL = regexp.MustCompile(`^https://github\.com/leasehold/leasehold/blob/main/(docs/runbooks/[a-z0-9-]+\.md)(?:#([a-z0-9_-]+))?$`)

// TestAlertsLinkRunbooks checks that every alert has a severity, a summary
// and a runbook_url naming an existing page of docs/runbooks/ (and, with
// an anchor, one of its headings).
func TestAlertsLinkRunbooks(t *testing.T) {
	t.Parallel()
	alerts := 0
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("%s: want a severity label and a summary annotation", r.Alert)
			}
			m := runbookURL.FindStringSubmatch(r.Annotations["runbook_url"])
			if m == nil {
				t.Errorf("%s: runbook_url %q does not match %s", r.Alert, r.Annotations["runbook_url"], runbookURL)
				continue
			}
			page, err := os.ReadFile(filepath.Join(moduleRoot, m[1]))
			if err != nil {
				t.Errorf("%s: runbook %v", r.Alert, err)
				continue
			}
			if m[2] != "" && !slices.Contains(headingAnchors(string(page)), m[2]) {
				t.Errorf("%s: %s has no heading with anchor #%s (it has %v)", r.Alert, m[1], m[2], headingAnchors(string(page)))
			}
		}
	}
	if alerts == 0 {
		t.Fatalf("%s holds no alerts", rulesFile)
	}
}

// headingAnchors returns the anchors GitHub gives a Markdown page's
// headings: lower case, spaces as dashes, other punctuation dropped.
func headingAnchors(page string) []string {
	var out []string
	for _, line := range strings.Split(page, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		out = append(out, b.String())
	}
	return out
}

// metricNames returns the Leasehold and gRPC server metrics an expression
// reads.
func metricNames(expr string) []string {
	return regexp.MustCompile(`\b(?:leasehold_[a-z0-9_]+|grpc_server_[a-z0-9_]+)\b`).FindAllString(expr, -1)
}
