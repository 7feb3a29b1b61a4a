package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The manifests are decoded strictly into the part of the Kubernetes API
// they use: a field these types do not know fails the test, as a
// misspelt field would fail kubectl's server-side validation. A manifest
// that starts using another field adds it here.

type objectMeta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type object struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   objectMeta `yaml:"metadata"`
}

type workload struct {
	object `yaml:",inline"`
	Spec   workloadSpec `yaml:"spec"`
	file   string
}

type workloadSpec struct {
	Replicas             *int           `yaml:"replicas"`
	ServiceName          string         `yaml:"serviceName"`
	PodManagementPolicy  string         `yaml:"podManagementPolicy"`
	Selector             labelSelector  `yaml:"selector"`
	MinReadySeconds      int            `yaml:"minReadySeconds"`
	Strategy             map[string]any `yaml:"strategy"`
	UpdateStrategy       map[string]any `yaml:"updateStrategy"`
	Template             podTemplate    `yaml:"template"`
	VolumeClaimTemplates []struct {
		Metadata objectMeta `yaml:"metadata"`
		Spec     struct {
			AccessModes []string `yaml:"accessModes"`
			Resources   struct {
				Requests map[string]string `yaml:"requests"`
			} `yaml:"resources"`
		} `yaml:"spec"`
	} `yaml:"volumeClaimTemplates"`
}

type podTemplate struct {
	Metadata objectMeta `yaml:"metadata"`
	Spec     podSpec    `yaml:"spec"`
}

type podSpec struct {
	TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
	AutomountServiceAccountToken  bool `yaml:"automountServiceAccountToken"`
	EnableServiceLinks            bool `yaml:"enableServiceLinks"`
	SecurityContext               struct {
		RunAsNonRoot   bool `yaml:"runAsNonRoot"`
		RunAsUser      int  `yaml:"runAsUser"`
		RunAsGroup     int  `yaml:"runAsGroup"`
		FSGroup        int  `yaml:"fsGroup"`
		SeccompProfile struct {
			Type string `yaml:"type"`
		} `yaml:"seccompProfile"`
	} `yaml:"securityContext"`
	Affinity *struct {
		PodAntiAffinity *struct {
			Required []struct {
				LabelSelector labelSelector `yaml:"labelSelector"`
				TopologyKey   string        `yaml:"topologyKey"`
			} `yaml:"requiredDuringSchedulingIgnoredDuringExecution"`
		} `yaml:"podAntiAffinity"`
	} `yaml:"affinity"`
	Containers []container `yaml:"containers"`
	Volumes    []volume    `yaml:"volumes"`
}

type volume struct {
	Name   string `yaml:"name"`
	Secret *struct {
		SecretName  string `yaml:"secretName"`
		DefaultMode int    `yaml:"defaultMode"`
	} `yaml:"secret"`
	PersistentVolumeClaim *struct {
		ClaimName string `yaml:"claimName"`
	} `yaml:"persistentVolumeClaim"`
	ConfigMap *struct {
		Name        string `yaml:"name"`
		DefaultMode int    `yaml:"defaultMode"`
	} `yaml:"configMap"`
}

// pod is a bare Pod: the maintenance shell on the coordinator's volume.
type pod struct {
	object `yaml:",inline"`
	Spec   podSpec `yaml:"spec"`
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []envVar `yaml:"env"`
	Ports   []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	StartupProbe    *probe                       `yaml:"startupProbe"`
	ReadinessProbe  *probe                       `yaml:"readinessProbe"`
	LivenessProbe   *probe                       `yaml:"livenessProbe"`
	Resources       map[string]map[string]string `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

type probe struct {
	GRPC *struct {
		Port    int     `yaml:"port"`
		Service *string `yaml:"service"`
	} `yaml:"grpc"`
	HTTPGet *struct {
		Path   string `yaml:"path"`
		Port   any    `yaml:"port"`
		Scheme string `yaml:"scheme"`
	} `yaml:"httpGet"`
	InitialDelaySeconds int `yaml:"initialDelaySeconds"`
	PeriodSeconds       int `yaml:"periodSeconds"`
	TimeoutSeconds      int `yaml:"timeoutSeconds"`
	FailureThreshold    int `yaml:"failureThreshold"`
	SuccessThreshold    int `yaml:"successThreshold"`
}

type service struct {
	object `yaml:",inline"`
	Spec   struct {
		ClusterIP string `yaml:"clusterIP"`
		// PublishNotReadyAddresses makes the cluster DNS answer with pods
		// that are not ready yet.
		PublishNotReadyAddresses bool              `yaml:"publishNotReadyAddresses"`
		Selector                 map[string]string `yaml:"selector"`
		Ports                    []servicePort     `yaml:"ports"`
	} `yaml:"spec"`
}

type servicePort struct {
	Name        string `yaml:"name"`
	Port        int    `yaml:"port"`
	TargetPort  any    `yaml:"targetPort"`
	AppProtocol string `yaml:"appProtocol"`
}

type disruptionBudget struct {
	object `yaml:",inline"`
	Spec   struct {
		MaxUnavailable any           `yaml:"maxUnavailable"`
		MinAvailable   any           `yaml:"minAvailable"`
		Selector       labelSelector `yaml:"selector"`
	} `yaml:"spec"`
}

// networkPolicy is a NetworkPolicy of ingress rules.
type networkPolicy struct {
	object `yaml:",inline"`
	Spec   struct {
		PodSelector labelSelector `yaml:"podSelector"`
		PolicyTypes []string      `yaml:"policyTypes"`
		Ingress     []struct {
			From []struct {
				PodSelector       *labelSelector `yaml:"podSelector"`
				NamespaceSelector *labelSelector `yaml:"namespaceSelector"`
			} `yaml:"from"`
			Ports []struct {
				Port any `yaml:"port"`
			} `yaml:"ports"`
		} `yaml:"ingress"`
	} `yaml:"spec"`
}

type secret struct {
	object     `yaml:",inline"`
	Type       string            `yaml:"type"`
	StringData map[string]string `yaml:"stringData"`
}

// configMap is a ConfigMap the operator creates: the CA that verifies
// the coordinator.
type configMap struct {
	object `yaml:",inline"`
	Data   map[string]string `yaml:"data"`
}

type kustomization struct {
	APIVersion string      `yaml:"apiVersion"`
	Kind       string      `yaml:"kind"`
	Namespace  string      `yaml:"namespace"`
	Resources  []string    `yaml:"resources"`
	Images     []kustImage `yaml:"images"`
}

type kustImage struct {
	Name    string `yaml:"name"`
	NewName string `yaml:"newName"`
	NewTag  string `yaml:"newTag"`
}

// manifests is every object of deploy/kubernetes, by kind.
type manifests struct {
	workloads  []*workload
	services   []*service
	budgets    []*disruptionBudget
	policies   []*networkPolicy
	pods       []*pod
	secrets    map[string]*secret    // the example Secrets, by name
	configMaps map[string]*configMap // the example ConfigMaps, by name
	files      map[string][]string   // file -> kinds, for the kustomization check
	kust       kustomization
}

const (
	kubeDir         = "kubernetes"
	exampleSecrets  = "secrets.example.yaml"
	kustomizationFn = "kustomization.yaml"
	// volumeShell is a Pod applied by hand during maintenance, never by
	// the kustomization.
	volumeShell = "volume-shell.yaml"
)

// loadManifests decodes every YAML file of deploy/kubernetes strictly.
func loadManifests(t *testing.T) *manifests {
	t.Helper()
	m := &manifests{secrets: map[string]*secret{}, configMaps: map[string]*configMap{}, files: map[string][]string{}}
	paths, err := filepath.Glob(filepath.Join(kubeDir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in %s: %v", kubeDir, err)
	}
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(path)
		if name == kustomizationFn {
			if err := decodeStrict(data, &m.kust); err != nil {
				t.Errorf("%s: %v", path, err)
			}
			continue
		}
		docs, err := splitDocuments(data)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		for i, doc := range docs {
			if err := m.add(name, doc); err != nil {
				t.Errorf("%s, document %d: %v", path, i+1, err)
			}
		}
	}
	return m
}

// add decodes one document by its kind.
func (m *manifests) add(file string, doc []byte) error {
	var head object
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return err
	}
	if head.APIVersion == "" || head.Kind == "" || head.Metadata.Name == "" {
		return fmt.Errorf("apiVersion, kind and metadata.name are required, got %+v", head)
	}
	want := map[string]string{
		"Namespace": "v1", "Service": "v1", "Secret": "v1", "ConfigMap": "v1",
		"StatefulSet": "apps/v1", "Deployment": "apps/v1", "PodDisruptionBudget": "policy/v1", "Pod": "v1",
		"NetworkPolicy": "networking.k8s.io/v1",
	}
	if v, ok := want[head.Kind]; !ok {
		return fmt.Errorf("kind %s: this test knows only %v; teach it the new kind", head.Kind, keys(want))
	} else if head.APIVersion != v {
		return fmt.Errorf("%s %s: apiVersion %s, want %s", head.Kind, head.Metadata.Name, head.APIVersion, v)
	}
	if file != exampleSecrets && file != volumeShell {
		m.files[file] = append(m.files[file], head.Kind)
	}
	switch head.Kind {
	case "Namespace":
		var ns struct {
			object `yaml:",inline"`
		}
		return decodeStrict(doc, &ns)
	case "StatefulSet", "Deployment":
		w := &workload{file: file}
		if err := decodeStrict(doc, w); err != nil {
			return err
		}
		m.workloads = append(m.workloads, w)
	case "Service":
		s := &service{}
		if err := decodeStrict(doc, s); err != nil {
			return err
		}
		m.services = append(m.services, s)
	case "PodDisruptionBudget":
		b := &disruptionBudget{}
		if err := decodeStrict(doc, b); err != nil {
			return err
		}
		m.budgets = append(m.budgets, b)
	case "NetworkPolicy":
		np := &networkPolicy{}
		if err := decodeStrict(doc, np); err != nil {
			return err
		}
		m.policies = append(m.policies, np)
	case "Pod":
		if file != volumeShell {
			return fmt.Errorf("Pod %s: workloads are StatefulSets and Deployments; a bare Pod belongs only in %s", head.Metadata.Name, volumeShell)
		}
		p := &pod{}
		if err := decodeStrict(doc, p); err != nil {
			return err
		}
		m.pods = append(m.pods, p)
	case "Secret":
		if file != exampleSecrets {
			return fmt.Errorf("Secret %s: secrets belong in %s as examples, never with real values in the manifests", head.Metadata.Name, exampleSecrets)
		}
		s := &secret{}
		if err := decodeStrict(doc, s); err != nil {
			return err
		}
		m.secrets[s.Metadata.Name] = s
	case "ConfigMap":
		if file != exampleSecrets {
			return fmt.Errorf("ConfigMap %s: the ConfigMaps the pods read are made per deployment; keep an example in %s", head.Metadata.Name, exampleSecrets)
		}
		cm := &configMap{}
		if err := decodeStrict(doc, cm); err != nil {
			return err
		}
		m.configMaps[cm.Metadata.Name] = cm
	}
	return nil
}

// splitDocuments splits a multi-document YAML file.
func splitDocuments(data []byte) ([][]byte, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs [][]byte
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		out, err := yaml.Marshal(&n)
		if err != nil {
			return nil, err
		}
		docs = append(docs, out)
	}
}

// decodeStrict decodes one document, refusing fields v does not have.
func decodeStrict(doc []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(doc))
	dec.KnownFields(true)
	return dec.Decode(v)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// workload returns the workload whose pods run the program, failing the
// test if there is not exactly one.
func (m *manifests) workloadOf(t *testing.T, program string) (*workload, *container) {
	t.Helper()
	var found []*workload
	var ctr *container
	for _, w := range m.workloads {
		for i := range w.Spec.Template.Spec.Containers {
			c := &w.Spec.Template.Spec.Containers[i]
			if len(c.Command) > 0 && filepath.Base(c.Command[0]) == program {
				found = append(found, w)
				ctr = c
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one container running %s, found %d", program, len(found))
	}
	return found[0], ctr
}

// serviceNamed returns the Service called name, or nil.
func (m *manifests) serviceNamed(name string) *service {
	for _, s := range m.services {
		if s.Metadata.Name == name {
			return s
		}
	}
	return nil
}

// selects reports whether every label of sel is in labels.
func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// containerPort resolves a port of a container given as a number or a
// name, returning 0 if the container does not declare it.
func (c *container) containerPort(port any) int {
	for _, p := range c.Ports {
		switch v := port.(type) {
		case int:
			if p.ContainerPort == v {
				return v
			}
		case string:
			if p.Name == v {
				return p.ContainerPort
			}
		}
	}
	return 0
}

// mountOf returns the volume mounted at the longest mount path holding
// path, and the path relative to it.
func (w *workload) mountOf(c *container, path string) (vol, rel string, ok bool) {
	best := -1
	for _, vm := range c.VolumeMounts {
		mp := strings.TrimSuffix(vm.MountPath, "/")
		if (path == mp || strings.HasPrefix(path, mp+"/")) && len(mp) > best {
			best = len(mp)
			vol, rel = vm.Name, strings.TrimPrefix(strings.TrimPrefix(path, mp), "/")
		}
	}
	return vol, rel, best >= 0
}

// secretVolume returns the Secret a pod volume projects, or "".
func (w *workload) secretVolume(name string) string {
	for _, v := range w.Spec.Template.Spec.Volumes {
		if v.Name == name && v.Secret != nil {
			return v.Secret.SecretName
		}
	}
	return ""
}

// configMapVolume returns the ConfigMap a pod volume projects, or "".
func (w *workload) configMapVolume(name string) string {
	for _, v := range w.Spec.Template.Spec.Volumes {
		if v.Name == name && v.ConfigMap != nil {
			return v.ConfigMap.Name
		}
	}
	return ""
}

// claimVolume reports whether name is one of the StatefulSet's claims.
func (w *workload) claimVolume(name string) bool {
	for _, c := range w.Spec.VolumeClaimTemplates {
		if c.Metadata.Name == name {
			return true
		}
	}
	return false
}
