package cli

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCompletionScriptsListEveryCommandAndFlag(t *testing.T) {
	t.Parallel()
	m := newCompletionModel()
	for _, shell := range []string{"bash", "zsh", "fish"} {
		t.Run(shell, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			code, out, errOut := b.run(t, "completion", shell)
			if code != ExitOK {
				t.Fatalf("exit status = %d; stderr:\n%s", code, errOut)
			}
			if len(b.dialed) != 0 {
				t.Errorf("completion dialed %v, want no connection", b.dialed)
			}
			for _, c := range append(commands, command{name: "help"}) {
				if !strings.Contains(out, c.name) {
					t.Errorf("the %s script lacks the command %s", shell, c.name)
				}
			}
			for _, c := range m.commands {
				for _, f := range append(c.flags, m.globals...) {
					word := f.dashed()
					if shell == "fish" {
						word = map[bool]string{true: "-s ", false: "-l "}[len(f.name) == 1] + f.name
					}
					if !strings.Contains(out, word) {
						t.Errorf("the %s script lacks %s of %s", shell, word, c.name)
					}
				}
			}
		})
	}

	t.Run("an unknown shell is a usage error", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if code, _, _ := b.run(t, "completion", "tcsh"); code != ExitUsage {
			t.Errorf("exit status = %d, want %d", code, ExitUsage)
		}
	})
}

// bashComplete loads the bash script and returns the completions of line
// (the word being completed is the last, possibly empty).
func bashComplete(t *testing.T, script string, words ...string) []string {
	t.Helper()
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = "'" + w + "'"
	}
	prog := script + "\nCOMP_WORDS=(" + strings.Join(quoted, " ") + ")\nCOMP_CWORD=" + strconv.Itoa(len(words)-1) +
		"\n_leasehold\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
	out, err := exec.Command("bash", "--norc", "--noprofile", "-c", prog).CombinedOutput()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	return strings.Fields(string(out))
}

func TestBashCompletionCompletes(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	b := setup(t)
	_, script, _ := b.run(t, "completion", "bash")
	if out, err := exec.Command("bash", "--norc", "--noprofile", "-n", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}
	tests := []struct {
		name  string
		words []string
		want  []string
	}{
		{"commands", []string{"leasehold", "su"}, []string{"submit"}},
		{"commands after global flags", []string{"leasehold", "--addr", "x:1", "-o", "json", "wa"}, []string{"watch"}},
		{"a command's flags with the global ones", []string{"leasehold", "submit", "--max-batch-i"}, []string{"--max-batch-inline-bytes"}},
		{"global flags before the command", []string{"leasehold", "--ti"}, []string{"--timeout"}},
		{"the values of a flag", []string{"leasehold", "list", "--phase", "SU"}, []string{"SUCCEEDED"}},
		{"the values of a global flag before the command", []string{"leasehold", "-o", ""}, []string{"table", "json"}},
		{"the shells of completion", []string{"leasehold", "completion", "z"}, []string{"zsh"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, bashComplete(t, script, tt.words...)); diff != "" {
				t.Errorf("completions of %q mismatch (-want +got):\n%s", tt.words, diff)
			}
		})
	}
}
