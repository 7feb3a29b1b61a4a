// Package deploy holds no code: its tests check the deployment files
// beside them against the programs they deploy. The Kubernetes manifests
// are decoded strictly and every flag and LEASEHOLD_* variable they set
// must be one that the built binaries' --help lists; ports, probes, grace
// periods, Secrets, TLS and the image must agree with each other; and the
// coordinator and renderer are run with the manifests' own configuration
// (volumes moved to temporary directories, addresses kept: they run in a
// network namespace of their own where the Service's names resolve) to
// show that the renderer reaches the coordinator's Service over TLS, that
// the probes pass as the kubelet asks them and that every metric the
// Prometheus rules use exists.
package deploy

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/testbin"
)

// binDir holds the binaries under test (see package testbin).
var binDir string

// moduleRoot is the repository root.
var moduleRoot string

func TestMain(m *testing.M) {
	testbin.Main("deploy", func(root, dir string) int {
		moduleRoot, binDir = root, dir
		code := 0
		goleak.VerifyTestMain(m, goleak.Cleanup(func(c int) { code = c }))
		return code
	})
}

// Margins the grace periods keep beyond the programs' own timeouts: the
// renderer hands back what is left after its drain and the coordinator
// closes bbolt after its shutdown timeout.
const graceMargin = 5 * time.Second

// dispatchHealthEntry is the coordinator's health entry for the dispatch
// switch; a readiness probe on it would take a paused coordinator out of
// its Service.
const dispatchHealthEntry = "leasehold.v1.Dispatch"

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
	coord, rend       *workload
	coordC, rendC     *container
	coordP, rendP     *program
	coordCfg, rendCfg config
}

// loadDeployment loads the manifests, finds the coordinator and renderer
// containers and resolves their configuration against the binaries'
// --help, reporting every unknown flag or variable.
func loadDeployment(t *testing.T) *deployment {
	t.Helper()
	d := &deployment{manifests: loadManifests(t)}
	d.coord, d.coordC = d.workloadOf(t, "coordinator")
	d.rend, d.rendC = d.workloadOf(t, "renderer")
	d.coordP, d.rendP = helpOf(t, "coordinator"), helpOf(t, "renderer")
	var errs []error
	d.coordCfg, errs = configOf(d.coordP, d.coordC, d.envResolver(d.coord))
	for _, err := range errs {
		t.Error(err)
	}
	d.rendCfg, errs = configOf(d.rendP, d.rendC, d.envResolver(d.rend))
	for _, err := range errs {
		t.Error(err)
	}
	return d
}

// podName is the name a pod of w gets, as fieldRef metadata.name sees it.
func podName(w *workload) string {
	if w.Kind == "StatefulSet" {
		return w.Metadata.Name + "-0"
	}
	return w.Metadata.Name + "-5d8f7c9b6d-x2x7q"
}

// envResolver returns the value a variable of w's containers takes from
// a Secret (the example's value) or from the pod's own fields.
func (d *deployment) envResolver(w *workload) func(envVar) (string, error) {
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
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			return podName(w), nil
		}
		return "", fmt.Errorf("this test cannot resolve %+v; teach it", e.ValueFrom)
	}
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
			t.Errorf("%s must not be applied with the rest; it runs only while the coordinator is stopped", volumeShell)
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

	t.Run("The coordinator is one replica with its data directory on a claim of its own", func(t *testing.T) {
		if d.coord.Kind != "StatefulSet" || d.coord.Spec.Replicas == nil || *d.coord.Spec.Replicas != 1 {
			t.Errorf("coordinator: %s with replicas %v, want a StatefulSet with exactly 1 (one writer per bbolt file)", d.coord.Kind, d.coord.Spec.Replicas)
		}
		dataDir := d.coordCfg["data-dir"]
		vol, _, ok := d.coord.mountOf(d.coordC, dataDir.value)
		if !ok || !d.coord.claimVolume(vol) {
			t.Errorf("%s=%s is not on one of the StatefulSet's volumeClaimTemplates", dataDir.source, dataDir.value)
		}
		headless := d.serviceNamed(d.coord.Spec.ServiceName)
		if headless == nil || headless.Spec.ClusterIP != "None" || !selects(headless.Spec.Selector, d.coord.Spec.Template.Metadata.Labels) {
			t.Errorf("serviceName %q is not a headless Service selecting the coordinator's pods", d.coord.Spec.ServiceName)
		}
		var budget *disruptionBudget
		for _, b := range d.budgets {
			if selects(b.Spec.Selector.MatchLabels, d.coord.Spec.Template.Metadata.Labels) {
				budget = b
			}
		}
		if budget == nil {
			t.Fatal("no PodDisruptionBudget selects the coordinator's pods")
		}
		if budget.Spec.MaxUnavailable != 0 {
			t.Errorf("the coordinator's PodDisruptionBudget has maxUnavailable %v; with one replica anything but 0 allows an eviction", budget.Spec.MaxUnavailable)
		}
	})

	t.Run("The volume shell mounts the coordinator's claim where the coordinator does, as its user", func(t *testing.T) {
		if len(d.pods) != 1 {
			t.Fatalf("want one Pod in %s, found %d", volumeShell, len(d.pods))
		}
		p := d.pods[0]
		if len(d.coord.Spec.VolumeClaimTemplates) != 1 {
			t.Fatalf("want one volumeClaimTemplate on the coordinator, found %d", len(d.coord.Spec.VolumeClaimTemplates))
		}
		claimVol := d.coord.Spec.VolumeClaimTemplates[0].Metadata.Name
		// A StatefulSet's claims are named <template>-<statefulset>-<ordinal>.
		wantClaim := claimVol + "-" + podName(d.coord)
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
				t.Errorf("%s mounts claim %s, want the coordinator's %s", volumeShell, v.PersistentVolumeClaim.ClaimName, wantClaim)
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
				if !slices.ContainsFunc(target.Spec.Template.Spec.Containers, func(c container) bool { return c.containerPort(p.TargetPort) != 0 }) {
					t.Errorf("Service %s port %s targets %v, which %s's containers do not declare", s.Metadata.Name, p.Name, p.TargetPort, target.Metadata.Name)
				}
				if p.AppProtocol == "kubernetes.io/h2c" && target == d.coord && d.coordTLS() {
					t.Errorf("Service %s port %s says kubernetes.io/h2c (HTTP/2 in the clear), but the coordinator serves TLS", s.Metadata.Name, p.Name)
				}
			}
		}
		coordAddr := d.rendCfg["coordinator"]
		if got, err := d.serviceTarget(coordAddr.value); err != nil {
			t.Errorf("renderer %s=%s: %v", coordAddr.source, coordAddr.value, err)
		} else if got != grpcPort {
			t.Errorf("renderer %s=%s reaches container port %d, want the coordinator's --listen port %d", coordAddr.source, coordAddr.value, got, grpcPort)
		}
	})

	t.Run("The coordinator's probes ask its health as a kubelet can: liveness the server's, readiness a service's", func(t *testing.T) {
		metricsPort := mustPort(t, d.coordCfg, "metrics-listen")
		probes := d.coordC.probes()
		for _, name := range []string{"startup", "readiness", "liveness"} {
			if probes[name] == nil {
				t.Errorf("the coordinator has no %s probe", name)
			}
		}
		// The health entry each probe reads: gRPC names it, the HTTP
		// endpoints stand for one (coordinator/httphealth.go).
		httpEntry := map[string]string{"/healthz": "", "/readyz": "leasehold.v1.JobService"}
		for name, p := range probes {
			entry, known := "", false
			switch {
			case p.GRPC != nil && d.coordTLS():
				t.Errorf("%s probe is a grpc probe, which the kubelet asks in plaintext: it cannot pass against a coordinator serving TLS; "+
					"probe /healthz or /readyz over HTTPS on the metrics port", name)
				continue
			case p.GRPC != nil && p.GRPC.Service != nil:
				entry, known = *p.GRPC.Service, true
			case p.HTTPGet != nil:
				if port := d.coordC.containerPort(p.HTTPGet.Port); port != metricsPort {
					t.Errorf("%s probe on port %v; the health endpoints are on the metrics port %d", name, p.HTTPGet.Port, metricsPort)
				}
				if scheme := cmp.Or(p.HTTPGet.Scheme, "HTTP"); d.coordTLS() != (scheme == "HTTPS") {
					t.Errorf("%s probe scheme %s, but the metrics port serves %s", name, scheme, map[bool]string{true: "HTTPS", false: "HTTP"}[d.coordTLS()])
				}
				entry, known = httpEntry[p.HTTPGet.Path]
			}
			if !known {
				t.Errorf("%s probe %+v reads no health entry this test knows", name, p)
				continue
			}
			switch {
			case name != "readiness" && entry != "":
				t.Errorf("%s probe reads the health of %q, want the server entry \"\"", name, entry)
			case name == "readiness" && entry == "":
				t.Error(`readiness reads the server entry ""; read a service entry, so that readiness is about what clients call`)
			case name == "readiness" && entry == dispatchHealthEntry:
				t.Errorf("readiness reads %s, which is NOT_SERVING while dispatch is paused: a pause would cut clients off", entry)
			}
		}
	})

	t.Run("Tokens cross the network over TLS only; no manifest turns on plaintext tokens or the development tokens", func(t *testing.T) {
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
		var tlsSecret string
		for _, flag := range []string{"tls-cert", "tls-key"} {
			s, ok := d.coordCfg[flag]
			if !ok || s.value == "" {
				t.Errorf("the coordinator has no --%s: it serves bearer tokens in plaintext", flag)
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
			tlsSecret = name
		}
		ca, ok := d.rendCfg["tls-ca"]
		if !ok {
			t.Fatal("the renderer has no --tls-ca: it cannot verify the coordinator")
		}
		vol, rel, ok := d.rend.mountOf(d.rendC, ca.value)
		name := d.rend.configMapVolume(vol)
		if !ok || name == "" || d.configMaps[name] == nil {
			t.Errorf("renderer %s=%s is on no example ConfigMap: the CA is public, and a Secret beside the coordinator's key invites mounting the key", ca.source, ca.value)
		} else if _, ok := d.configMaps[name].Data[rel]; !ok {
			t.Errorf("renderer %s=%s: ConfigMap %s has no key %s", ca.source, ca.value, name, rel)
		}
		for _, w := range d.workloads {
			for _, v := range w.Spec.Template.Spec.Volumes {
				if w != d.coord && v.Secret != nil && v.Secret.SecretName == tlsSecret {
					t.Errorf("%s mounts Secret %s, the coordinator's private key", w.Metadata.Name, tlsSecret)
				}
			}
		}
		if host, _, err := net.SplitHostPort(d.rendCfg["coordinator"].value); err != nil || d.serviceNamed(strings.Split(host, ".")[0]) == nil {
			t.Errorf("renderer --coordinator=%s: want the coordinator's Service, which its certificate names", d.rendCfg["coordinator"].value)
		}
	})

	t.Run("deploy/README.md says how to make a certificate for each of the Service's names", func(t *testing.T) {
		readme, err := os.ReadFile("README.md")
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range append(d.serviceDNSNames(t), "server_name: "+d.scrapeServerName(t)) {
			if !strings.Contains(string(readme), name) {
				t.Errorf("deploy/README.md does not mention %s", name)
			}
		}
	})

	t.Run("Grace periods cover the renderer's drain and the coordinator's shutdown", func(t *testing.T) {
		for _, c := range []struct {
			w    *workload
			cfg  config
			flag string
		}{{d.rend, d.rendCfg, "drain-timeout"}, {d.coord, d.coordCfg, "shutdown-timeout"}} {
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
			if grace < timeout+graceMargin {
				t.Errorf("%s: terminationGracePeriodSeconds %v, want at least %v (%s=%s) + %v", c.w.Metadata.Name, grace, timeout, s.source, s.value, graceMargin)
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
		if id.value != podName(d.rend) {
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

// serviceDNSNames returns the names a pod may reach the Service of the
// renderers' --coordinator by: the Service's name, with its namespace,
// with .svc and with the cluster domain. The coordinator's certificate
// must carry them all.
func (d *deployment) serviceDNSNames(t *testing.T) []string {
	t.Helper()
	host, _, err := net.SplitHostPort(d.rendCfg["coordinator"].value)
	if err != nil {
		t.Fatalf("renderer --coordinator: %v", err)
	}
	svc, _, _ := strings.Cut(host, ".")
	ns := d.kust.Namespace
	return []string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc.cluster.local"}
}

// scrapeServerName is the name Prometheus verifies the coordinator's
// certificate against when it scrapes a pod by IP (deploy/README.md).
func (d *deployment) scrapeServerName(t *testing.T) string {
	t.Helper()
	return d.serviceDNSNames(t)[2]
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
	return 0, fmt.Errorf("Service %s has no port %d reaching a container", name, port)
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
	for _, line := range strings.Split(text, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "FROM":
			froms = append(froms, fields[1])
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
