package deploy

import (
	"bufio"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/testbin"
)

// flagDef is one flag as a program's --help describes it.
type flagDef struct {
	name string
	bool bool   // takes no value
	env  string // its LEASEHOLD_* variable, if the help names one
	def  string // its default, "" if none is shown
}

// program is what --help says about a binary's flags.
type program struct {
	name  string
	flags map[string]flagDef
	envs  map[string]string // variable -> flag
}

var (
	// helpFlag matches a flag line of Go's flag.PrintDefaults.
	helpFlag = regexp.MustCompile(`^  -([a-z0-9][a-z0-9-]*)(?: (\S+))?$`)
	// helpEnv finds the flag's own variable: "(env LEASEHOLD_X)" or
	// "(LEASEHOLD_X)" or "(LEASEHOLD_X; ...)", not a variable merely named.
	helpEnv = regexp.MustCompile(`\((?:env )?(LEASEHOLD_[A-Z0-9_]+)[;)]`)
	// helpDefault is the default Go's flag package appends.
	helpDefault = regexp.MustCompile(`\(default (.*)\)$`)
)

// helpOf runs "bin --help" with no LEASEHOLD_* variables set and parses
// the flags it lists.
func helpOf(t *testing.T, name string) *program {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, name), "--help")
	cmd.Env = testbin.Env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", name, err, out)
	}
	p := &program{name: name, flags: map[string]flagDef{}, envs: map[string]string{}}
	var cur *flagDef
	flush := func() {
		if cur == nil {
			return
		}
		p.flags[cur.name] = *cur
		if cur.env != "" {
			p.envs[cur.env] = cur.name
		}
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := sc.Text()
		if m := helpFlag.FindStringSubmatch(line); m != nil {
			flush()
			cur = &flagDef{name: m[1], bool: m[2] == ""}
			continue
		}
		if cur == nil || !strings.HasPrefix(line, "    \t") {
			continue
		}
		usage := strings.TrimPrefix(line, "    \t")
		if m := helpEnv.FindStringSubmatch(usage); m != nil && cur.env == "" {
			cur.env = m[1]
		}
		if m := helpDefault.FindStringSubmatch(usage); m != nil {
			cur.def = m[1]
			if u, err := strconv.Unquote(cur.def); err == nil {
				cur.def = u
			}
		}
	}
	flush()
	if len(p.flags) == 0 {
		t.Fatalf("%s --help lists no flags:\n%s", name, out)
	}
	return p
}

// setting is one value of a container's configuration and where it came
// from, for messages.
type setting struct {
	value  string
	source string // "--flag", "LEASEHOLD_X" or "default"
}

// config is the configuration a container gives its program: every flag's
// value after the defaults, the container's environment and its arguments,
// in the order the programs apply them.
type config map[string]setting

// envSetting is one variable of a container's environment, as the
// container runtime sets it.
type envSetting struct {
	name, value string
}

// containerEnv returns the environment Kubernetes gives a container, in
// order: each variable's value, env resolving those that are not literal
// (secretKeyRef, fieldRef), with the $(NAME) references of a literal
// value to variables defined before it expanded.
func containerEnv(c *container, env func(envVar) (string, error)) ([]envSetting, []error) {
	var out []envSetting
	var errs []error
	defined := map[string]string{}
	for _, e := range c.Env {
		v, err := env(e)
		if err != nil {
			errs = append(errs, fmt.Errorf("container %s, %s: %v", c.Name, e.Name, err))
			continue
		}
		if e.ValueFrom == nil {
			v = expandKube(v, defined)
		}
		defined[e.Name] = v
		out = append(out, envSetting{e.Name, v})
	}
	return out, errs
}

// containerArgs returns a container's arguments with the $(NAME)
// references to its environment expanded, as Kubernetes expands them.
func containerArgs(c *container, env []envSetting) []string {
	vars := map[string]string{}
	for _, e := range env {
		vars[e.name] = e.value
	}
	var out []string
	for _, a := range c.Args {
		out = append(out, expandKube(a, vars))
	}
	return out
}

// expandKube expands s as Kubernetes expands a container's command,
// arguments and literal variable values: $(NAME) becomes the value of a
// variable defined in vars and stays as it is otherwise, and $$ is an
// escaped $.
func expandKube(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch next := s[i+1]; {
		case next == '$':
			b.WriteByte('$')
			i++
		case next == '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// configOf checks that every argument and every LEASEHOLD_* variable of c
// exists in p, and returns the resulting configuration, with the
// variables and arguments expanded as Kubernetes expands them. env
// resolves the value of a variable that is not literal (secretKeyRef,
// fieldRef), for the pod whose configuration it is.
func configOf(p *program, c *container, env func(envVar) (string, error)) (config, []error) {
	cfg := config{}
	for _, f := range p.flags {
		if f.def != "" {
			cfg[f.name] = setting{f.def, "default"}
		}
	}
	vars, errs := containerEnv(c, env)
	for _, e := range vars {
		if !strings.HasPrefix(e.name, "LEASEHOLD_") {
			continue
		}
		name, ok := p.envs[e.name]
		if !ok {
			errs = append(errs, fmt.Errorf("container %s sets %s, which %s --help does not list", c.Name, e.name, p.name))
			continue
		}
		cfg[name] = setting{e.value, e.name}
	}
	args := containerArgs(c, vars)
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if !strings.HasPrefix(arg, "-") {
			errs = append(errs, fmt.Errorf("container %s: argument %q is not a flag; %s takes flags only", c.Name, arg, p.name))
			continue
		}
		if strings.Contains(arg, "$(") {
			errs = append(errs, fmt.Errorf("container %s: argument %q names a variable the container does not define; Kubernetes passes it as it is", c.Name, arg))
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		f, ok := p.flags[name]
		if !ok {
			errs = append(errs, fmt.Errorf("container %s passes --%s, which %s --help does not list", c.Name, name, p.name))
			continue
		}
		switch {
		case hasValue:
		case f.bool:
			value = "true"
		case i+1 < len(args):
			i++
			value = args[i]
		default:
			errs = append(errs, fmt.Errorf("container %s: --%s needs a value", c.Name, name))
			continue
		}
		cfg[name] = setting{value, "--" + name}
	}
	return cfg, errs
}

// port returns the port of a host:port setting.
func (s setting) port() (int, error) {
	_, port, err := splitHostPort(s.value)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %v", s.source, s.value, err)
	}
	return port, nil
}

// splitHostPort splits host:port with a numeric port.
func splitHostPort(s string) (string, int, error) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return "", 0, fmt.Errorf("%q is not host:port", s)
	}
	port, err := strconv.Atoi(s[i+1:])
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("%q has no numeric port", s)
	}
	return s[:i], port, nil
}
